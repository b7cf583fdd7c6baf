"""The audit as two keyed passes over the files: the driver gets findings and counts.

1. ``dlog``: every bulk file once; per-entry rows compared across replicas
   per (group, index range); the driver gets per-file summaries and runs,
   and derives each group's committed prefix and agreement (``dgroup``).
2. ``dmsgs``: the message records and ConsumeQueue units joined per (group,
   position range) with the bounds pass 1 fixed, units per (group, queue,
   slot range), committed identities per (group, identity bucket).

What reaches the driver is bounded by the number of files, runs (one per
stretch of the log where the replicas' agreement does not change) and
findings; never a row per entry or per message. The result is an
``prepare.AuditResult`` with the same findings as the in-process engine
(``audit.run_audit`` with ``LocalEngine``), which the tests check on every
fault scenario.
"""

from __future__ import annotations

import functools
import itertools
import struct
import time
from collections import defaultdict
from typing import Any, Protocol

import msgpack
import numpy as np
import pyarrow as pa

from spark_audit import (
    checks,
    dgroup,
    digest,
    dlog,
    dmsgs,
    flow,
    history,
    hits,
    inputs,
    prepare,
    replicas,
)
from spark_audit.checks import INFO, VIOLATION, Findings
from spark_audit.engine import Engine
from spark_audit.replicas import ProblemRow

# A ConsumeQueue file as the comparisons see it: first slot, length, CRC, view.
CqFile = tuple[int, int, int, "inputs.View | None"]


class FlowEngine(Engine, Protocol):
    flow: flow.Flow


def _load(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False, strict_map_key=False)


def _map1(task: dlog.Task, buf: Any, p: dlog.Params) -> Any:
    return dlog.map_file(task, buf, p)


def _red1(key: flow.Key, blocks: list[flow.Block], p: dlog.Params) -> bytes:
    return dlog.reduce_log(key, blocks, p)


def _map2(task: dmsgs.Task, buf: Any, p: dmsgs.Params) -> Any:
    return dmsgs.map_file(task, buf, p)


def _red2(key: flow.Key, blocks: list[flow.Block], p: dmsgs.Params) -> bytes:
    return dmsgs.reduce(key, blocks, p)


def probes(st: checks.GroupState) -> list[int]:
    """Indexes whose rows pass 1 returns: snapshots, and the borders of the ranges
    replicas should hold (where a retained-away range may start or end)."""
    want: set[int] = set()
    for m in st.replicas.values():
        want |= {s.meta.index for s in m.snapshots.values() if s.meta is not None}
        cp = m.checkpoint
        if cp is not None:
            want |= {cp.durable_index, cp.durable_index + 1, cp.first_index,
                     cp.first_index - 1}
    return sorted(i for i in want if i > 0)


def run(opts: prepare.AuditOptions, eng: FlowEngine) -> prepare.AuditResult:
    prep = prepare.prepare(opts, eng)
    tm = prep.timings
    groups = prep.groups
    fl = eng.flow
    out = prep.out
    refs = {gid: prepare.reference_replica(st) for gid, st in groups.items()}
    seg_size = {gid: opts.segment_size or checks.infer_segment_size(
        sorted({s for m in st.replicas.values() for s in m.segment_starts}))
        for gid, st in groups.items()}
    p1 = dlog.Params(opts.max_entry_size, opts.max_examples, seg_size, refs,
                     {gid: sorted(st.replicas) for gid, st in groups.items()},
                     {gid: probes(st) for gid, st in groups.items()}, prep.digests,
                     prep.digest_spans)

    # Pass 1.
    t0 = time.perf_counter()
    todo = dlog.tasks_for(prep.bulk)
    res1 = fl.run(todo, functools.partial(_map1, p=p1), functools.partial(_red1, p=p1),
                  lambda t: t.cost)
    tm["pass1_job_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    glogs = {gid: dgroup.GroupLog() for gid in groups}
    summ: dict[int, dict[str, Any]] = {}
    task_s: dict[str, float] = defaultdict(float)
    for (space, gid, chunk), data in res1:
        v = _load(data)
        if space == flow.SUMMARY:
            summ[v["tid"]] = v
        else:
            glogs[gid].add_reduced(v, chunk)
            task_s["tasks_p1_reduce_cpu_s"] += v["cpu"]
    problem_rows: list[ProblemRow] = []
    counts: dict[str, int] = defaultdict(int)
    summ_by_fid: dict[int, dict[str, Any]] = {}
    deletions: dict[int, dict[int, list[tuple[int, str]]]] = {
        gid: {rid: [] for rid in st.replicas} for gid, st in groups.items()}
    seg_files: dict[tuple[int, int], list[tuple[int, list[int], list[int]]]] = defaultdict(list)
    cq_content: dict[tuple[int, int], dict[tuple[str, int], list[CqFile]]] = (
        defaultdict(lambda: defaultdict(list)))
    seg_range: dict[int, tuple[int, int] | None] = {}
    for t in todo:
        s, f = summ[t.tid], t.info
        summ_by_fid[f.fid] = s
        task_s[f"tasks_p1_{t.mode}_cpu_s"] += s["cpu"]
        task_s[f"tasks_p1_{t.mode}_wall_s"] += s["wall"]
        problem_rows += [ProblemRow(gid=f.gid, rid=f.rid, fid=f.fid, file_offset=p[0],
                                    index=p[1], problem=p[2], detail=p[3])
                         for p in s.get("problems", [])]
        if t.mode == dlog.SEG:
            counts["entries"] += s["n"]
            seg_range[f.fid] = (s["min_index"], s["max_index"]) if s["n"] else None
            deletions[f.gid][f.rid] += [(int(d), str(x)) for d, x in s["deletions"]]
            glogs[f.gid].pieces += hits.load(s["hits"])
            if s["n"]:
                seg_files[(f.gid, f.rid)].append((f.start, s["first"], s["last"]))
                log = glogs[f.gid].logs.setdefault(f.rid, dgroup.LogSummary())
                log.min_index = min(log.min_index, s["min_index"]) if log.entries else s[
                    "min_index"]
                log.entries += s["n"]
        elif t.mode == dlog.INDEX:
            counts["index"] += s["n"]
        elif t.mode == dlog.CQ:
            counts["cq"] += s["count"]
            # A file's view (units a cut or window drops) is part of its content.
            cq_content[(f.gid, f.rid)][(f.topic, f.queue_id)].append(
                (f.start, s["length"], s["crc"], f.view))
        else:
            snap = groups[f.gid].replicas[f.rid].snapshots[f.start]
            snap.state_length, snap.state_crc = s["length"], s["crc"]
    first_pos: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for (gid, rid), segs in seg_files.items():
        segs.sort()
        log = glogs[gid].logs[rid]
        log.first, log.last = segs[0][1], segs[-1][2]
        dgroup.boundary_hits(glogs[gid], rid, [(a[2], b[1]) for a, b in itertools.pairwise(segs)],
                             seg_size[gid], gid, opts.max_examples + 1)
        first_pos[(gid, rid)] = (np.array([x[1][2] for x in segs], np.int64),
                                 np.array([x[1][4] for x in segs], np.int64))
    found = [out.table()]
    for gid, st in groups.items():
        g = glogs[gid]
        g.seal()
        found.append(dgroup.check_group(g, st, opts.max_examples, opts.segment_size))
        found.append(dgroup.check_snapshots(g, st))
        pieces = Findings()
        hits.merge(g.pieces, opts.max_examples, pieces)
        found.append(pieces.table())
        found.append(dgroup.index_findings(g, st, opts.max_examples))
        counts["runs"] += len(g.runs)
    tm["log_checks_s"] = time.perf_counter() - t1

    # Pass 2.
    t2 = time.perf_counter()
    bounds: dict[int, dict[int, tuple[int, int, int, int]]] = {}
    dead = {}
    slot_queues: dict[int, set[tuple[str, int]]] = {}
    for gid, st in groups.items():
        bounds[gid] = {}
        for rid, m in st.replicas.items():
            qb = checks.queue_bounds(st, m)
            bounds[gid][rid] = (qb.committed, qb.must_index, qb.log_start, qb.log_end)
        dead[gid] = prepare.dead_before(st, deletions[gid], opts.deletions.get(st.name))
        qs = {q for rid in st.replicas for q in cq_content[(gid, rid)]}
        slot_queues[gid] = {q for q in qs if len({tuple(sorted(cq_content[(gid, rid)][q]))
                                                  for rid in st.replicas
                                                  if cq_content[(gid, rid)][q]}) > 1}
    own = {gid: {rid: set(ch) for rid, ch in glogs[gid].diff_ref.items()} for gid in groups}
    cq_fids = {(f.gid, f.rid, f.topic, f.queue_id, f.start): f.fid for f in prep.bulk
               if f.kind == inputs.CQ}
    p2 = dmsgs.Params(opts.max_entry_size, opts.max_examples, refs, bounds, dead,
                      {gid: st.sources for gid, st in groups.items()},
                      {gid: sorted(st.replicas) for gid, st in groups.items()}, own, cq_fids,
                      slot_queues, {gid: st.committed // dmsgs.ID_RECORDS + 1
                                    for gid, st in groups.items()})
    todo2: list[dmsgs.Task] = []
    for f in prep.bulk:
        if f.kind != inputs.SEGMENT or seg_range.get(f.fid) is None:
            continue
        lo, hi = seg_range[f.fid]  # type: ignore[misc]
        mine = own[f.gid].get(f.rid, set())
        if f.rid == refs[f.gid] or any(lo // dlog.LOG_CHUNK <= c <= hi // dlog.LOG_CHUNK
                                       for c in mine):
            todo2.append(dmsgs.Task(len(todo2), f, dmsgs.SEG))
    # One task per distinct ConsumeQueue content (topic, queue, first slot, length, CRC).
    cq_size = {f.fid: (summ_by_fid[f.fid]["length"], summ_by_fid[f.fid]["crc"])
               for f in prep.bulk if f.kind == inputs.CQ}
    holders: dict[tuple[Any, ...], list[inputs.FileInfo]] = defaultdict(list)
    for f in prep.bulk:
        if f.kind == inputs.CQ:
            # Units outside a file's view are dropped as it is read: the view is
            # part of what makes two files' units the same.
            ck = (f.gid, f.topic, f.queue_id, f.start, f.view, *cq_size[f.fid])
            holders[ck if opts.share_identical else (*ck[:-1], f.rid)].append(f)
    for fs in holders.values():
        fs.sort(key=lambda f: f.rid)
        todo2.append(dmsgs.Task(len(todo2), fs[0], dmsgs.CQ,
                                mask=sum(1 << f.rid for f in fs)))
    gids = {st.name: gid for gid, st in groups.items()}
    if opts.history:
        todo2.append(dmsgs.Task(len(todo2), None, dmsgs.KEYS,
                                history.history_keys(prep.hist_msgs, gids)))
    res2 = fl.run(todo2, functools.partial(_map2, p=p2), functools.partial(_red2, p=p2),
                  lambda t: t.cost)
    tm["pass2_job_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    qf = Findings()
    q_pieces: list[tuple[hits.StreamKey, int, list[hits.Hit]]] = []
    beyond: dict[tuple[int, int, str, int], list[int]] = {}
    dead_n: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    queues: dict[int, set[tuple[str, int]]] = defaultdict(set)
    dups: dict[int, list[list[Any]]] = defaultdict(list)
    matched: set[tuple[int, int, int, int]] = set()
    summ2: dict[int, dict[str, Any]] = {}
    for (space, gid, _), data in res2:
        if space == flow.SUMMARY:
            v = _load(data)
            summ2[v["tid"]] = v
            continue
        v = _load(data[:-8])
        task_s["tasks_p2_reduce_cpu_s"] += struct.unpack("<d", data[-8:])[0]
        q_pieces += hits.load(v.get("hits", []))
        if space == flow.OFFSET:
            counts["messages"] += sum(v["counts"].values())
            for b in v["beyond"]:
                k = (gid, b[0], b[1], b[2])
                cur = beyond.get(k)
                beyond[k] = [b[3] + (cur[0] if cur else 0),
                             *(min(cur[1:], b[4:]) if cur else b[4:])]
            for t, n in v["dead"].items():
                dead_n[gid][t] += n
            queues[gid] |= {(t, q) for t, q in v["queues"]}
        elif space == flow.IDS:
            dups[gid] += v["dups"]
        for a, b, x in v.get("hist", []):
            matched.add((gid, a, b, x))
    unit_edges: dict[tuple[int, int, str, int], list[tuple[int, list[list[int]]]]] = (
        defaultdict(list))
    seg_fid = {(f.gid, f.rid, f.start): f.fid for f in prep.bulk if f.kind == inputs.SEGMENT}
    for task2 in todo2:
        s = summ2[task2.tid]
        task_s[f"tasks_p2_{task2.mode}_cpu_s"] += s["cpu"]
        task_s[f"tasks_p2_{task2.mode}_wall_s"] += s["wall"]
        f2 = task2.info
        if f2 is None:
            continue
        if task2.mode == dmsgs.SEG:
            counts["messages_decoded"] += s["n"]
            for p in s["problems"]:
                # A record the reference decoded for replicas sharing its entries there
                # is wrong on each of them (the same bytes), at the same file offset.
                chunk = p[1] // dlog.LOG_CHUNK
                for rid in groups[f2.gid].replicas:
                    if rid == f2.rid or (f2.rid == refs[f2.gid] and chunk not in own[f2.gid].get(
                            rid, set()) and (f2.gid, rid, f2.start) in seg_fid):
                        problem_rows.append(ProblemRow(
                            gid=f2.gid, rid=rid, fid=seg_fid.get((f2.gid, rid, f2.start), f2.fid),
                            file_offset=p[0], index=p[1], problem=p[2], detail=p[3]))
        else:
            for rid in (r for r in groups[f2.gid].replicas if task2.mask >> r & 1):
                fid = cq_fids[(f2.gid, rid, f2.topic, f2.queue_id, f2.start)]
                for key, n, hs in hits.load(s["hits"]):
                    q_pieces.append(((*key[:3], rid, *key[4:]), n,
                                     [(o, {**x, "fid": fid}, nx) for o, x, nx in hs]))
                if s["edge"] is not None:
                    unit_edges[(f2.gid, rid, f2.topic, f2.queue_id)].append(
                        (f2.start, [[*e[:2], fid] for e in s["edge"]]))
    for (gid, rid, topic, q), edges in unit_edges.items():
        edges.sort()
        h = hits.Hits(opts.max_examples + 1)
        for (_, a), (_, b) in itertools.pairwise(edges):
            u = np.zeros(2, dmsgs.UNIT_DTYPE)
            u["slot"], u["offset"], u["fid"] = [a[1][0], b[0][0]], [a[1][1], b[0][1]], [
                a[1][2], b[0][2]]
            dmsgs.unit_order(h, u, gid, rid, topic, q)
        q_pieces += hits.load(h.dump())
    hits.merge(q_pieces, opts.max_examples, qf)
    for row in qf.rows:
        if row["kind"] == "cq_not_indexed" and row["fid"] == -2:
            pos, fids = first_pos.get((row["gid"], row["rid"]), (np.zeros(1, np.int64),
                                                                  np.full(1, -1, np.int64)))
            at = int(np.searchsorted(pos, row["phys_offset"], side="right")) - 1
            row["fid"] = int(fids[max(at, 0)])
    for (gid, rid, topic, q), (n, slot, off, idx) in sorted(beyond.items()):
        qf.add("index_validity", "cq_beyond_commit", INFO, gid=gid, rid=rid, topic=topic,
               queue_id=q, slot=slot, phys_offset=off, index=idx, count=n,
               detail=f"{n} units point at entries beyond the known committed index "
                      f"{groups[gid].committed} (hardstate commit is lazy)")
    names = {(r.gid, r.rid): r.name for r in prep.replicas}
    for gid, st in groups.items():
        ref = refs[gid]
        for topic, before in sorted(dead[gid].get(ref, {}).items()):
            n = dead_n[gid].get(topic, 0)
            if n:
                qf.add("index_validity", "topic_deleted", INFO, gid=gid, topic=topic,
                       index=before, count=n,
                       detail=f"{topic} was deleted by entry {before}: its {n} messages in "
                              "earlier entries are dead (never indexed again)")
        if opts.share_identical:
            _shared(qf, gid, st, ref, bounds[gid], dead[gid], glogs[gid].diff_ref,
                    cq_content, queues[gid], names, counts)
    found.append(qf.table())
    tm["queue_checks_s"] = time.perf_counter() - t3
    t4 = time.perf_counter()
    dup = Findings()
    for gid in groups:
        _duplicates(dup, gid, dups[gid], opts.max_examples)
    found.append(dup.table())
    tm["duplicate_checks_s"] = time.perf_counter() - t4
    starts = {f.fid: f.start for f in prep.files}
    kinds = {f.fid: f.kind for f in prep.files}
    durable_end = {(g, rid): (m.checkpoint.durable_end if m.checkpoint else 0)
                   for g, st in groups.items() for rid, m in st.replicas.items()}
    found.append(checks.problem_findings(replicas.problems_table(problem_rows), starts, kinds,
                                         durable_end))
    counts["problems"] = len(problem_rows)

    hstats: dict[str, int] = {}
    if opts.history:
        t7 = time.perf_counter()
        rows = sorted(matched)
        cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
        table = pa.table({"gid": pa.array(cols[0], pa.int32()),
                          "producer_id": pa.array(cols[1], pa.int64()),
                          "sequence": pa.array(cols[2], pa.int64()),
                          "phys_offset": pa.array(cols[3], pa.int64())})
        floors = {gid: st.retained_from for gid, st in groups.items()}
        away = {gid: [(g.pos_lo, g.pos_hi) for g in st.retained_away]
                for gid, st in groups.items()}
        hf, hstats = history.check_history(prep.hist_msgs, table, gids, opts.max_examples,
                                           floors, away)
        hstats["body_digests"] = sum(len(d) for d in prep.digests.values())
        hstats["ops"] = prep.nops
        found.append(hf)
        tm["history_s"] = time.perf_counter() - t7

    files = prep.files
    counts.update({
        "groups": len(groups), "replicas": len(prep.replicas), "files": len(files),
        "bytes": sum(f.length for f in files),
        "segments": sum(f.kind == inputs.SEGMENT for f in files),
        "segment_bytes": sum(f.length for f in files if f.kind == inputs.SEGMENT),
    })
    by_kind: dict[str, int] = defaultdict(int)
    for f in files:
        by_kind[f.kind] += 1
    tm.update(task_s)
    # A span no reduce call saw (no replica holds any of its indexes) is empty on each.
    span_digests = {gid: {span: {rid: glogs[gid].digests.get(span, {}).get(
        rid, (0, digest.EMPTY)) for rid in groups[gid].replicas} for span in spans}
        for gid, spans in prep.digest_spans.items()}
    return prepare.AuditResult(prep.replicas, files, groups, checks.concat_findings(found),
                               {**counts, "files_by_kind": dict(by_kind)}, hstats, tm,
                               span_digests, {gid: prepare.agreed_deletions(st, deletions[gid])
                                              for gid, st in groups.items()})


def _shared(out: Findings, gid: int, st: checks.GroupState, ref: int,
            bounds: dict[int, tuple[int, int, int, int]], dead: dict[int, dict[str, int]],
            diff_ref: dict[int, set[int]],
            cq_content: dict[tuple[int, int], dict[tuple[str, int], list[CqFile]]],
            msg_queues: set[tuple[str, int]], names: dict[tuple[int, int], str],
            counts: dict[str, int]) -> None:
    """``cq_same_as_reference``: queues a replica would have had validated once, on the
    reference, by the in-process engine (same log, bounds and ConsumeQueue files, and the
    reference's findings there carry no file)."""
    qkeys = msg_queues | {q for rid in st.replicas for q in cq_content[(gid, rid)]}
    ref_kinds: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in out.rows:
        if r["gid"] == gid and r["rid"] == ref and r["queue_id"] >= 0:
            ref_kinds[(r["topic"], r["queue_id"])].add(r["kind"])
    for rid in sorted(st.replicas):
        if rid == ref or bounds[rid] != bounds[ref] or dead.get(rid) != dead.get(ref) or (
                rid in diff_ref):
            continue
        n = sum(1 for q in qkeys
                if sorted(cq_content[(gid, rid)].get(q, [])) == sorted(
                    cq_content[(gid, ref)].get(q, []))
                and ref_kinds[q] <= prepare.SHAREABLE)
        if n:
            counts["cq_queues_shared"] += n
            out.add("index_validity", "cq_same_as_reference", INFO, gid=gid, rid=rid, count=n,
                    detail=f"{n} of {len(qkeys)} queues: ConsumeQueue files byte-identical "
                           f"(per-file CRC and length) to replica {names[(gid, ref)]}'s over "
                           "an identical log, validated once on that replica")


def _duplicates(out: Findings, gid: int, runs: list[list[Any]], max_examples: int) -> None:
    """``checks.find_duplicate_ids`` from the runs each identity bucket found."""
    runs.sort(key=lambda r: (r[0], r[1]))
    for shown, (pid, seq, index, phys, count, where) in enumerate(runs):
        if shown < max_examples:
            out.add("duplicates", "duplicate_client_id", VIOLATION, gid=gid, index=index,
                    phys_offset=phys, count=count,
                    detail=f"producer {pid & 0xFFFFFFFFFFFFFFFF:#x} sequence {seq} "
                           "stored at " + ", ".join(str(x) for x in where))
        else:
            out.add("duplicates", "duplicate_client_id", VIOLATION, gid=gid, count=count,
                    detail="further occurrences not listed")
