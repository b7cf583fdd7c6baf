"""The audit run: on a flow engine distributed, in process on the driver's arrays.

``run_audit`` hands an engine with a ``flow`` (the Spark engine) to
``distributed``. Otherwise (the in-process engine, for small data): discover
the files and read the small ones (``prepare``); the scan pass (every bulk
file, the reference replica's records decoded); log checks on the compact
entry arrays; the decode pass (only what no decoded replica shares, see
``replicas``); queue, duplicate and history checks on the driver's arrays.
Both find exactly the same (the tests compare them on every fault scenario).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import cast

import numpy as np
import pyarrow as pa

from spark_audit import (
    bodies,
    checks,
    control,
    digest,
    distributed,
    engine,
    history,
    inputs,
    parse,
    prepare,
    replicas,
    snapshots,
    tasks,
)
from spark_audit.checks import INFO, Findings
from spark_audit.prepare import AuditOptions, AuditResult, dead_before, reference_replica
from spark_audit.replicas import ContentKey, ProblemRow

__all__ = ["AuditOptions", "AuditResult", "dead_before", "reference_replica", "run_audit"]


def run_audit(opts: AuditOptions, eng: engine.Engine) -> AuditResult:
    """Run every check with ``eng`` (``LocalEngine`` or ``SparkEngine``).

    An engine with a ``flow`` (``SparkEngine``) runs the distributed audit
    (``distributed``): the driver receives findings and counts only. The
    in-process engine assembles every replica's arrays here.
    """
    if getattr(eng, "flow", None) is not None:
        return distributed.run(opts, cast("distributed.FlowEngine", eng))
    prep = prepare.prepare(opts, eng)
    replicas_, files, groups, out = prep.replicas, prep.files, prep.groups, prep.out
    bulk, hist_msgs, nops, digests, tm = (prep.bulk, prep.hist_msgs, prep.nops, prep.digests,
                                          prep.timings)
    want_crcs = bool(digests)

    # Pass 1: every bulk file once; the reference replica's records fully decoded.
    t2 = time.perf_counter()
    refs = {gid: reference_replica(st) for gid, st in groups.items()}
    todo: list[tasks.FileTask] = []
    for f in bulk:
        is_ref = f.rid == refs[f.gid]
        mode = {inputs.SEGMENT: tasks.SCAN_MSGS if is_ref else tasks.SCAN,
                inputs.INDEX: tasks.INDEX,
                inputs.CQ: tasks.CQ_UNITS if is_ref else tasks.CQ_HASH,
                inputs.SNAPSHOT_STATE: tasks.CRC}[f.kind]
        todo.append(tasks.FileTask(len(todo), f, mode, digests=want_crcs))
    results = sorted(eng.run_tasks(todo, opts.max_entry_size), key=lambda r: r.tid)
    tm["scan_job_s"] = time.perf_counter() - t2
    task_s: dict[str, float] = defaultdict(float)
    # Topic deletions read from each replica's CONTROL entries, by group and replica.
    deletions: dict[int, dict[int, list[control.Deletion]]] = {
        gid: {rid: [] for rid in st.replicas} for gid, st in groups.items()}
    for task, res in zip(todo, results, strict=True):
        task_s[f"tasks_{task.mode}_cpu_s"] += res.cpu
        task_s[f"tasks_{task.mode}_wall_s"] += res.seconds
        deletions[task.info.gid][task.info.rid] += res.deletions
        if task.mode == tasks.CRC:
            snap = groups[task.info.gid].replicas[task.info.rid].snapshots[task.info.start]
            snap.state_length, snap.state_crc = res.length, res.crc

    t3 = time.perf_counter()
    topics = replicas.Topics()
    data = {gid: replicas.Group(gid, refs[gid], {rid: replicas.ReplicaLog(gid, rid)
                                                 for rid in st.replicas})
            for gid, st in groups.items()}
    units: dict[ContentKey, np.ndarray] = {}
    # Implausible ConsumeQueue units, by file content: reported on every replica
    # holding that content (identical files are decoded once).
    cq_problems: dict[ContentKey, list[parse.Problem]] = {}
    problem_rows: list[ProblemRow] = []
    counts: dict[str, int] = defaultdict(int)
    seg_slices = _assemble(todo, results, data, topics, units, cq_problems, problem_rows,
                           counts, opts.share_identical)

    span_digests = {gid: _digests(data[gid], spans) for gid, spans in prep.digest_spans.items()}
    found = [out.table()]
    for gid in groups:
        data[gid].assign_identities(opts.share_identical)
    for task, res in zip(todo, results, strict=True):
        if task.mode == tasks.SCAN_MSGS:
            g = data[task.info.gid]
            lo, hi = seg_slices[task.tid]
            g.add_decoded(g.replicas[task.info.rid].eid[lo:hi], res, task.info, topics)
    assemble_s = time.perf_counter() - t3

    # Pass 2: only what no decoded replica shares (usually nothing).
    t4 = time.perf_counter()
    todo2, eids2 = _decode_plan(data, units, files, want_crcs)
    for res in eng.run_tasks(todo2, opts.max_entry_size):
        task = todo2[res.tid]
        task_s[f"tasks_{task.mode}_cpu_s"] += res.cpu
        task_s[f"tasks_{task.mode}_wall_s"] += res.seconds
        if task.mode == tasks.MSGS:
            data[task.info.gid].add_decoded(eids2[res.tid], res, task.info, topics)
        else:
            ck = replicas.cq_content_key(task.info, res, opts.share_identical)
            units[ck] = tasks.produced(res.units)
            cq_problems[ck] = [p for p in res.problems if p[2] == "implausible_value"]
    for g in data.values():
        g.seal()
        problem_rows += g.problem_rows()
        for rep in g.replicas.values():
            for files_q in rep.cq.values():
                for f, ck in files_q:
                    problem_rows += [ProblemRow(gid=f.gid, rid=f.rid, fid=f.fid,
                                                file_offset=p[0], index=p[1], problem=p[2],
                                                detail=p[3])
                                     for p in cq_problems.get(ck, [])]
    counts["decode_tasks"] = len(todo2)
    tm["decode_job_s"] = time.perf_counter() - t4

    # Log checks, with each entry version's body verdict when the history has digests.
    t3 = time.perf_counter()
    verdicts = {gid: bodies.verdicts(data[gid], digests.get(gid)) for gid in groups}
    for gid, st in groups.items():
        reps = [data[gid].replicas[r] for r in sorted(st.replicas)]
        table = replicas.entries_table(reps)
        if want_crcs:
            eid = np.concatenate([r.eid for r in reps] or [np.zeros(0, np.int64)])
            table = table.append_column("refuted", pa.array(verdicts[gid].refuted[eid]))
            table = table.append_column("confirmed", pa.array(verdicts[gid].confirmed[eid]))
        found.append(checks.check_group(table, st, opts.max_examples, opts.segment_size))
        found.append(snapshots.check_snapshots(table, st))
        found.append(bodies.body_findings(data[gid], verdicts[gid], opts.max_examples))
        for rep in reps:
            found.append(checks.check_index_files(
                replicas.index_table(rep), replicas.entries_table([rep]), gid, rep.rid,
                opts.max_examples))
    # Assembly and log checks, one phase as bench/audit.py reports it.
    tm["log_checks_s"] = assemble_s + time.perf_counter() - t3
    starts = {f.fid: f.start for f in files}
    kinds = {f.fid: f.kind for f in files}
    durable_end = {(g, rid): (m.checkpoint.durable_end if m.checkpoint else 0)
                   for g, st in groups.items() for rid, m in st.replicas.items()}
    found.append(checks.problem_findings(replicas.problems_table(problem_rows), starts, kinds,
                                         durable_end))
    counts["problems"] = len(problem_rows)

    t5 = time.perf_counter()
    names = {(r.gid, r.rid): r.name for r in replicas_}
    for gid, st in groups.items():
        g = data[gid]
        counts["messages"] += sum(g.message_count(r) for r in g.replicas)
        counts["messages_decoded"] += len(g.pool)
        found.append(queue_checks(g, st, units, topics, names, counts, opts.max_examples,
                                  opts.share_identical, dead_before(
                                      st, deletions[gid], opts.deletions.get(st.name))))
    counts["cq_units_decoded"] = sum(len(u) for u in units.values())
    tm["queue_checks_s"] = time.perf_counter() - t5

    t6 = time.perf_counter()
    dup = Findings()
    committed = {gid: data[gid].committed_messages(st.sources) for gid, st in groups.items()}
    for gid, msgs in committed.items():
        checks.find_duplicate_ids(dup, gid, msgs, opts.max_examples)
    found.append(dup.table())
    tm["duplicate_checks_s"] = time.perf_counter() - t6

    hstats: dict[str, int] = {}
    if opts.history:
        t7 = time.perf_counter()
        gids = {st.name: gid for gid, st in groups.items()}
        keys = history.history_keys(hist_msgs, gids)
        matched = pa.concat_tables([checks.lookup_keys(gid, committed[gid], keys)
                                    for gid in groups])
        floors = {gid: st.retained_from for gid, st in groups.items()}
        away = {gid: [(g.pos_lo, g.pos_hi) for g in st.retained_away]
                for gid, st in groups.items()}
        hf, hstats = history.check_history(hist_msgs, matched, gids, opts.max_examples, floors,
                                           away)
        hstats["body_digests"] = sum(len(d) for d in digests.values())
        hstats["ops"] = nops
        found.append(hf)
        tm["history_s"] = time.perf_counter() - t7

    counts.update({
        "groups": len(groups), "replicas": len(replicas_), "files": len(files),
        "bytes": sum(f.length for f in files),
        "segments": sum(f.kind == inputs.SEGMENT for f in files),
        "segment_bytes": sum(f.length for f in files if f.kind == inputs.SEGMENT),
    })
    by_kind: dict[str, int] = defaultdict(int)
    for f in files:
        by_kind[f.kind] += 1
    # CPU and wall seconds inside the file tasks, by mode (summed over tasks,
    # whichever core ran them); wall above CPU is waiting for a core.
    tm.update(task_s)
    return AuditResult(replicas_, files, groups, checks.concat_findings(found),
                       {**counts, "files_by_kind": dict(by_kind)}, hstats, tm, span_digests,
                       {gid: prepare.agreed_deletions(st, deletions[gid])
                        for gid, st in groups.items()})


def _digests(g: replicas.Group, spans: list[digest.Span]
             ) -> dict[digest.Span, dict[int, tuple[int, str]]]:
    """Every replica's digest of every span (``digest``), from its entry rows."""
    out: dict[digest.Span, dict[int, tuple[int, str]]] = {s: {} for s in spans}
    for rid, rep in g.replicas.items():
        for span, d in zip(spans, digest.of_spans(rep.entries, spans), strict=True):
            out[span][rid] = d
    return out


def _assemble(todo: list[tasks.FileTask], results: list[tasks.FileResult],
              data: dict[int, replicas.Group], topics: replicas.Topics,
              units: dict[ContentKey, np.ndarray],
              cq_problems: dict[ContentKey, list[parse.Problem]],
              problem_rows: list[ProblemRow], counts: dict[str, int], share: bool
              ) -> dict[int, tuple[int, int]]:
    """Put the scan pass's per-file results together per replica (in log order).

    Fills the replicas' entries, Raft-index records and ConsumeQueue file
    lists, the decoded units by content key, the problem rows and counts;
    returns, per segment task id, the rows its entries occupy in its replica's
    entries (to find their identities once they are assigned).
    """
    seg_slices: dict[int, tuple[int, int]] = {}
    by_replica: dict[tuple[int, int], list[tuple[tasks.FileTask, tasks.FileResult]]] = (
        defaultdict(list))
    for task, res in zip(todo, results, strict=True):
        by_replica[(task.info.gid, task.info.rid)].append((task, res))
        f = task.info
        problem_rows += [ProblemRow(gid=f.gid, rid=f.rid, fid=f.fid, file_offset=p[0],
                                    index=p[1], problem=p[2], detail=p[3]) for p in res.problems
                         if not (f.kind == inputs.CQ and p[2] == "implausible_value")]
    for (gid, rid), done in by_replica.items():
        rep = data[gid].replicas[rid]
        # (task, its entries) of each segment, (task, its records) of each
        # Raft-index file, in log order.
        segs = sorted(((t, tasks.produced(r.entries)) for t, r in done
                       if t.info.kind == inputs.SEGMENT), key=lambda tr: tr[0].info.start)
        at = 0
        for t, entries in segs:
            seg_slices[t.tid] = (at, at + len(entries))
            at += len(entries)
        if segs:
            rep.entries = np.concatenate([entries for _, entries in segs])
            rep.fid = np.concatenate([np.full(len(entries), t.info.fid, np.int32)
                                      for t, entries in segs])
        idx = sorted(((t, tasks.produced(r.index)) for t, r in done
                      if t.info.kind == inputs.INDEX), key=lambda tr: tr[0].info.start)
        if idx:
            rep.index = np.concatenate([index for _, index in idx])
            rep.index_fid = np.concatenate([np.full(len(index), t.info.fid, np.int32)
                                            for t, index in idx])
        for t, r in sorted(((t, r) for t, r in done if t.info.kind == inputs.CQ),
                           key=lambda tr: tr[0].info.start):
            ck = replicas.cq_content_key(t.info, r, share)
            if r.units is not None:
                units[ck] = r.units
                cq_problems[ck] = [p for p in r.problems if p[2] == "implausible_value"]
            q = int(topics.qkey(np.array([topics.id(t.info.topic)]),
                                np.array([t.info.queue_id]))[0])
            rep.cq.setdefault(q, []).append((t.info, ck))
            counts["cq"] += r.count
    counts["entries"] = sum(len(r.entries) for g in data.values() for r in g.replicas.values())
    counts["index"] = sum(len(r.index) for g in data.values() for r in g.replicas.values())
    return seg_slices


def _decode_plan(data: dict[int, replicas.Group], units: dict[ContentKey, np.ndarray],
                 files: list[inputs.FileInfo], digests: bool = False
                 ) -> tuple[list[tasks.FileTask],
                                                        dict[int, np.ndarray]]:
    """Tasks of the decode pass, and the entry identities of each ``msgs`` task.

    One ``msgs`` task per segment holding identities no decoded replica has
    (lowest replica id first), one ``cq_units`` task per ConsumeQueue content
    not decoded yet.
    """
    todo: list[tasks.FileTask] = []
    eids: dict[int, np.ndarray] = {}
    files_by_id = {f.fid: f for f in files}
    for g in data.values():
        for rep, rows in g.missing():
            for fid in np.unique(rep.fid[rows]):
                mine = rows[rep.fid[rows] == fid]
                eids[len(todo)] = rep.eid[mine]
                todo.append(tasks.FileTask(len(todo), files_by_id[int(fid)], tasks.MSGS,
                                           rep.entries[mine].tobytes(), digests))
    wanted: set[ContentKey] = set()
    for g in data.values():
        for rep in g.replicas.values():
            for files_q in rep.cq.values():
                for f, ck in files_q:
                    if ck not in units and ck not in wanted:
                        wanted.add(ck)
                        todo.append(tasks.FileTask(len(todo), f, tasks.CQ_UNITS))
    return todo, eids


def queue_checks(g: replicas.Group, st: checks.GroupState,
                 units: dict[ContentKey, np.ndarray],
                 topics: replicas.Topics, names: dict[tuple[int, int], str],
                 counts: dict[str, int], max_examples: int, share: bool = True,
                 dead: dict[int, dict[str, int]] | None = None) -> pa.Table:
    """Every replica's ConsumeQueues of one group against its messages.

    A replica whose MESSAGES entries are identical to the reference replica's
    (same eids) and whose bounds are equal has the same messages per queue;
    where its ConsumeQueue files of a queue are also byte-identical (same
    content keys) it would get exactly the reference's findings, so the
    reference's are copied instead of validating again (only when those carry
    no file ids, i.e. there is nothing but ``cq_beyond_commit``; otherwise it
    is validated for its own file names). ``cq_same_as_reference`` (info)
    says how many queues of a replica were covered this way.

    ``dead`` (``dead_before``): messages of a deleted topic in entries below
    its deletion are left out of that replica's queues (``topic_deleted``,
    info, says how many on the reference replica); a unit still pointing at
    one is dangling.
    """
    out = Findings()
    gid = g.gid
    dead = dead or {}
    bounds = {}
    for rid, m in st.replicas.items():
        bounds[rid] = checks.queue_bounds(st, m)
    ref = g.replicas[g.ref]
    slices = {g.ref: replicas.queue_slices(g.messages(g.ref), topics)}
    same = {}
    for rid, rep in g.replicas.items():
        same[rid] = rid == g.ref or (bounds[rid] == bounds[g.ref]
                                     and dead.get(rid) == dead.get(g.ref)
                                     and np.array_equal(rep.msg_eids, ref.msg_eids))
        if rid not in slices:
            slices[rid] = (slices[g.ref] if same[rid]
                           else replicas.queue_slices(g.messages(rid), topics))
    qkeys = sorted({q for s in slices.values() for q in s}
                   | {q for rep in g.replicas.values() for q in rep.cq})
    empty = np.zeros(0, g.pool.dtype)
    gone: dict[tuple[str, int], int] = defaultdict(int)  # dead messages on the reference

    def live(rid: int, q: int, topic: str) -> np.ndarray:
        msgs = slices[rid].get(q, empty)
        before = dead.get(rid, {}).get(topic, 0)
        if not before or not len(msgs):
            return msgs
        kept = msgs[msgs["index"] >= before]
        if rid == g.ref:
            gone[(topic, before)] += len(msgs) - len(kept)
        return kept

    shared = dict.fromkeys(g.replicas, 0)
    order = [g.ref, *sorted(r for r in g.replicas if r != g.ref)]
    for q in qkeys:
        topic, qid = topics.split(q)
        content = {rid: [ck for _, ck in g.replicas[rid].cq.get(q, [])] for rid in order}
        ref_rows: list[checks.FindingRow] = []
        for rid in order:
            rep = g.replicas[rid]
            if (share and rid != g.ref and same[rid] and content[rid] == content[g.ref]
                    and all(r["kind"] in prepare.SHAREABLE for r in ref_rows)):
                out.rows += [{**r, "rid": rid} for r in ref_rows]
                shared[rid] += 1
                continue
            u, ufid = replicas.queue_units(rep, q, units)
            local = Findings()
            checks.check_queue_replica(local, gid, topic, qid, rid, live(rid, q, topic), u,
                                       ufid, rep.entry_fid, bounds[rid], max_examples)
            if rid == g.ref:
                ref_rows = local.rows
            out.rows += local.rows
        if len({tuple(c) for c in content.values() if c}) > 1:
            views = [(rid, replicas.queue_units(g.replicas[rid], q, units)[0])
                     for rid in sorted(g.replicas)]
            checks.slot_conflicts(out, gid, topic, qid, [v for v in views if len(v[1])],
                                  max_examples)
    for (topic, before), n in sorted(gone.items()):
        if n:
            out.add("index_validity", "topic_deleted", INFO, gid=gid, topic=topic, index=before,
                    count=n, detail=f"{topic} was deleted by entry {before}: its {n} messages "
                                    "in earlier entries are dead (never indexed again)")
    for rid, n in shared.items():
        if n:
            counts["cq_queues_shared"] += n
            out.add("index_validity", "cq_same_as_reference", INFO, gid=gid, rid=rid, count=n,
                    detail=f"{n} of {len(qkeys)} queues: ConsumeQueue files byte-identical "
                           f"(per-file CRC and length) to replica {names[(gid, g.ref)]}'s over "
                           "an identical log, validated once on that replica")
    return out.table()
