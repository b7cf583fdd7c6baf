"""What both ways of running the audit share: options, result, the start and the end.

``prepare`` discovers the files, decodes the small ones (checkpoint,
hardstate, dispatch checkpoint, snapshot metas, identity) into each replica's
``checks.ReplicaMeta``, checks the replicas' identities against each other
(``identities``) and reads the history; ``audit.run_audit`` (every
array on the driver) and ``distributed.run`` (keyed passes, the driver gets
findings) both go on from there, and end with ``problem_findings``,
``history_findings`` and ``result``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_audit import (
    checks,
    control,
    digest,
    engine,
    fmt,
    history,
    identities,
    inputs,
    replicas,
    window,
)
from spark_audit.checks import INFO, VIOLATION, Findings
from spark_audit.replicas import ProblemRow

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class AuditOptions:
    specs: list[str]
    history: list[str] = field(default_factory=list)
    max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE
    segment_size: int = 0  # 0: inferred from segment file names
    max_examples: int = 20
    # False: decode and validate every replica from its own bytes, sharing
    # nothing between identical replicas (slower; cross-checks the sharing).
    share_identical: bool = True
    # Per group name: the window audited (``window``: a cut, a start); absent: all.
    bounds: dict[str, window.Bounds] = field(default_factory=dict)
    # Per group name: the index spans whose per-replica digests to compute
    # (``digest``, for the nightly manifest).
    digests: dict[str, digest.Plan] = field(default_factory=dict)
    # Per group name: topic deletions (index, topic) verified outside the window
    # (``dead_before``; the nightly manifest keeps those its new ranges held).
    deletions: dict[str, list[control.Deletion]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_sizes(self.max_entry_size, self.segment_size)


def check_sizes(max_entry_size: int, segment_size: int) -> None:
    """Refuse (ValueError) sizes no log can have, before anything is read: judged
    by them, every entry would be reported, a finding about the options."""
    if max_entry_size < fmt.ENTRY_HEADER_SIZE:
        raise ValueError(f"the largest entry size ({max_entry_size}) must be at least an "
                         f"entry header ({fmt.ENTRY_HEADER_SIZE} bytes)")
    if segment_size < 0 or 0 < segment_size < fmt.ENTRY_HEADER_SIZE:
        raise ValueError(f"the segment size ({segment_size}) must be 0 (inferred from the "
                         f"file names) or at least {fmt.ENTRY_HEADER_SIZE} bytes")


def check_segment_size(size: int, segments: list[inputs.FileInfo]) -> None:
    """Refuse (ValueError) a configured segment size the segment files contradict:
    a file that does not start at a multiple of it, or one longer than it (an
    entry never spans segments). Believed, it would report every entry past
    the first rollover as out of place, a finding about the option."""
    for f in segments:
        if f.start % size:
            starts = sorted({g.start for g in segments})
            raise ValueError(f"--segment-size {size} does not fit {f.path}: it does not "
                             f"start at a multiple of it (the names suggest "
                             f"{checks.infer_segment_size(starts)}; leave the option out to "
                             "infer it)")
        if f.length > size:
            raise ValueError(f"--segment-size {size} does not fit {f.path}, which is "
                             f"{f.length} bytes long")


@dataclass
class AuditResult:
    replicas: list[inputs.Replica]
    files: list[inputs.FileInfo]
    groups: dict[int, checks.GroupState]
    findings: pa.Table
    # What was read (summary.json's "inputs"): counts, and the files by kind.
    counts: dict[str, int | dict[str, int]]
    history_stats: dict[str, int]
    timings: dict[str, float]
    # Per group id: span (lo, hi) -> replica id -> (entries, digest) (``digest``).
    digests: dict[int, dict[tuple[int, int], dict[int, tuple[int, str]]]] = field(
        default_factory=dict)
    # Per group id: the topic deletions of the agreed, committed log read (``control``).
    deletions: dict[int, list[control.Deletion]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        sev = self.findings.column("severity").to_pylist()
        return VIOLATION not in sev


@dataclass
class Prepared:
    """What both ways of running the audit start from: the inventory, the small files
    decoded into each replica's ``ReplicaMeta``, their findings, and the history."""

    replicas: list[inputs.Replica]
    files: list[inputs.FileInfo]
    groups: dict[int, checks.GroupState]
    out: Findings
    bulk: list[inputs.FileInfo]
    hist_msgs: list[history.HistMsg]
    nops: int
    digests: dict[int, pd.DataFrame]
    timings: dict[str, float]
    # Per group id: the index spans whose per-replica digests the passes compute.
    digest_spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


def prepare(opts: AuditOptions, eng: engine.Engine) -> Prepared:
    """Discover the files, read the small ones and the history."""
    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    set_aside: list[str] = []
    shared: list[tuple[inputs.FileInfo, inputs.FileInfo]] = []
    replicas_ = inputs.parse_group_specs(opts.specs, eng.lister, set_aside)
    files = inventory = inputs.inventory(replicas_, eng.lister, set_aside, shared)
    if opts.segment_size:
        check_segment_size(opts.segment_size, [f for f in inventory if f.kind == inputs.SEGMENT])
    tm["discover_s"] = time.perf_counter() - t0
    out = Findings()
    for f, first in shared:
        out.add("corruption", "shared_file", VIOLATION, gid=f.gid, rid=f.rid, fid=f.fid,
                detail=f"{f.path} is the same file as {first.path} (a link): these replicas "
                       "do not hold copies of their own, so one disk's loss loses both")
    for path in set_aside:
        out.add("corruption", "set_aside_dir", INFO,
                detail=f"{path}: set aside by `ledgermq node repair` (out of service, not a "
                       "replica): not audited")

    groups: dict[int, checks.GroupState] = {}
    for r in replicas_:
        st = groups.setdefault(r.gid, checks.GroupState(r.gid, r.group, {}))
        st.replicas[r.rid] = checks.ReplicaMeta(r.rid, r.name)
    small = [f for f in inventory if f.kind in inputs.SMALL_KINDS]
    t1 = time.perf_counter()
    small_data = eng.read_small(small)
    for f in small:
        meta = groups[f.gid].replicas[f.rid]
        if f.kind == inputs.SNAPSHOT_META:
            meta.snapshots.setdefault(f.start, checks.SnapshotFiles(f.start)).meta_fid = f.fid
        try:
            value = engine.decode_small(f.kind, small_data[f.fid])
        except fmt.FormatError as exc:
            # A CRC-valid file with a value no log can hold is implausible, not torn;
            # either way its values are not used.
            if isinstance(exc, fmt.ImplausibleValue):
                kind = "implausible_value"
            elif isinstance(exc, fmt.UnsupportedFormat):
                kind = "unsupported_format"
            else:
                kind = f"bad_{f.kind}"
            out.add("corruption", kind, VIOLATION, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path}: {exc}")
            continue
        # One parser per kind (engine.decode_small): the type says which file it was.
        if isinstance(value, fmt.Checkpoint):
            meta.checkpoint = value
        elif isinstance(value, fmt.HardState):
            meta.hardstate = value
        elif isinstance(value, fmt.SnapshotMeta):
            meta.snapshots[f.start].meta = value
        elif isinstance(value, fmt.Identity):
            meta.identity = value
        else:
            meta.dispatch = value
    for f in inventory:
        if f.kind == inputs.SEGMENT:
            groups[f.gid].replicas[f.rid].segment_starts.append(f.start)
        elif f.kind == inputs.SNAPSHOT_STATE:
            groups[f.gid].replicas[f.rid].snapshots.setdefault(
                f.start, checks.SnapshotFiles(f.start)).state_fid = f.fid
        elif f.kind == inputs.INSTALL_MARKER:
            out.add("corruption", "install_pending", INFO, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path}: a snapshot install was interrupted after its commit "
                           "point; the broker finishes it when it opens the log (this replica "
                           "is audited half swapped)")
        elif f.kind == inputs.BAD_NAME:
            out.add("corruption", "implausible_value", VIOLATION, gid=f.gid, rid=f.rid,
                    fid=f.fid, detail=f"{f.path}: the number in its name puts the file above "
                                      "2^63-1, a position, Raft index or slot no log reaches "
                                      "(not read)")
        elif f.kind == inputs.OTHER:
            out.add("corruption", "unknown_file", INFO, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path} is not part of the format (reported, not read)")
    identities.check(groups, inventory, out)
    tm["read_small_s"] = time.perf_counter() - t1
    if opts.bounds:
        if opts.history:
            raise ValueError("the history check needs the whole log: --history cannot be "
                             "combined with --cut or --from")
        t2 = time.perf_counter()
        files = window.apply(opts.bounds, eng, inventory, groups, opts.max_entry_size)
        tm["window_s"] = time.perf_counter() - t2
        for gid, st in groups.items():
            for rid in st.past_cut_unread:
                out.add("index_validity", "deletions_past_cut_unread", INFO, gid=gid, rid=rid,
                        detail=f"the topic deletions between the cut {st.cut} and what this "
                               "replica dispatched could not be read (more than "
                               f"{window.DELETION_SCAN_MAX} entries, or their Raft-index "
                               "records are missing or damaged): a topic deleted since the "
                               "cut shows as cq_not_indexed on it")
    bulk = [f for f in files if f.kind in inputs.BULK_KINDS]
    spans = {gid: digest.plan_spans(opts.digests[st.name], st)
             for gid, st in groups.items() if st.name in opts.digests}

    # The history first: when it records body digests, records are decoded with
    # their body CRCs, to compare every replica's bodies with the bodies sent.
    hist_msgs: list[history.HistMsg] = []
    nops = 0
    digests: dict[int, pd.DataFrame] = {}
    if opts.history:
        hist_msgs, nops = history.read_history(opts.history)
        digests = history.send_digests(hist_msgs, {st.name: gid for gid, st in groups.items()})
    return Prepared(replicas_, files, groups, out, bulk, hist_msgs, nops, digests, tm, spans)


def reference_replica(st: checks.GroupState) -> int:
    """The replica whose records are all decoded: the most durable one, lowest id on ties.

    Any choice gives the same findings (replicas that differ from it are
    decoded where they differ); the most durable one most likely holds the
    committed log, so that nothing else needs decoding.
    """
    return max(st.replicas.values(), key=lambda m: (
        m.checkpoint.durable_index if m.checkpoint else -1, -m.rid)).rid


# Findings without a file id: valid for an identical copy.
SHAREABLE = {"cq_beyond_commit"}


def same_as_reference(out: Findings, counts: dict[str, int], gid: int, rid: int, n: int,
                      queues: int, reference: str) -> None:
    """``cq_same_as_reference`` (info): ``n`` of the group's ``queues`` queues of replica
    ``rid`` were validated once, on the ``reference`` replica, their ConsumeQueue files
    byte-identical to its over an identical log (counted in ``cq_queues_shared``)."""
    if not n:
        return
    counts["cq_queues_shared"] += n
    out.add("index_validity", "cq_same_as_reference", INFO, gid=gid, rid=rid, count=n,
            detail=f"{n} of {queues} queues: ConsumeQueue files byte-identical "
                   f"(per-file CRC and length) to replica {reference}'s over "
                   "an identical log, validated once on that replica")


def topic_deleted(out: Findings, gid: int, topic: str, before: int, n: int) -> None:
    """``topic_deleted`` (info): the topic's ``n`` messages in entries before its deletion
    entry ``before`` are dead (``dead_before``): no queue indexes them again."""
    if not n:
        return
    out.add("index_validity", "topic_deleted", INFO, gid=gid, topic=topic, index=before,
            count=n, detail=f"{topic} was deleted by entry {before}: its {n} messages "
                            "in earlier entries are dead (never indexed again)")


def dead_before(st: checks.GroupState, deletions: dict[int, list[control.Deletion]],
                known: list[control.Deletion] | None = None) -> dict[int, dict[str, int]]:
    """Per replica, topic -> D: the topic's messages in entries below D are dead.

    A deletion counts when its entry is in the agreed log (the replica it was
    read from agrees with the group there) and the replica has applied it
    (dispatched that far; the committed index when it has no dispatch
    checkpoint): until then its queue files still index the old messages.
    ``known``: deletions verified outside the audited window (``AuditOptions``;
    the nightly audit's manifest), which count for a replica whose dispatch
    checkpoint, as read before a cut clamped it, is past them: a window below a
    later deletion does not read it, and the replica dropped the topic's queues.
    The deletions a cut's window read past its end (``st.past_cut_deletions``,
    ``window``) count the same way: a live broker may apply one between the
    cut and the audit's reads. Either kind also counts for a replica whose
    checkpoint stands just below it and no longer lists the topic (the one
    the broker writes as it drops the topic's queues).
    """
    agreed = {(d, t) for rid, ds in deletions.items() for d, t in ds
              if st.replicas[rid].agree_start <= d <= st.replicas[rid].agree_end}
    out: dict[int, dict[str, int]] = {}
    for rid, m in st.replicas.items():
        applied = m.dispatch.dispatched_index if m.dispatch else st.committed
        mine: dict[str, int] = {}
        for d, t in agreed:
            if d <= applied:
                mine[t] = max(mine.get(t, 0), d)
        # The broker drops a topic's queues while it applies the deleting entry
        # D, writing a checkpoint at D - 1 that no longer lists the topic: that
        # replica has applied the deletion too.
        listed = {t for t, _, _ in m.dispatch.queues} if m.dispatch is not None else None
        for d, t in [*(known or []), *st.past_cut_deletions]:
            dropped = d == m.dispatched_on_disk + 1 and listed is not None and t not in listed
            if (d, t) not in agreed and d > 0 and (d <= m.dispatched_on_disk or dropped):
                mine[t] = max(mine.get(t, 0), d)
        out[rid] = mine
    return out


def agreed_deletions(st: checks.GroupState, deletions: dict[int, list[control.Deletion]]
                     ) -> list[control.Deletion]:
    """The deletions read from entries in the agreed, committed log (what the nightly
    manifest keeps for later windows)."""
    return sorted({(d, t) for rid, ds in deletions.items() for d, t in ds
                   if st.replicas[rid].agree_start <= d <= min(st.replicas[rid].agree_end,
                                                                st.committed)})


def problem_findings(prep: Prepared, rows: list[ProblemRow]) -> pa.Table:
    """The parse problems an engine collected, as findings (``checks.problem_findings``:
    a torn tail past its replica's durable end is what a crash leaves, info)."""
    starts = {f.fid: f.start for f in prep.files}
    kinds = {f.fid: f.kind for f in prep.files}
    durable_end = {(g, rid): (m.checkpoint.durable_end if m.checkpoint else 0)
                   for g, st in prep.groups.items() for rid, m in st.replicas.items()}
    return checks.problem_findings(replicas.problems_table(rows), starts, kinds, durable_end)


def history_findings(prep: Prepared, matched: pa.Table, max_examples: int
                     ) -> tuple[pa.Table, dict[str, int]]:
    """The history check (``history.check_history``) on the committed messages the
    history's keys matched (``matched``), excusing what retention removed from every
    replica (below ``retained_from``, in ``retained_away`` ranges); its counts, with
    the body digests and operations the history holds."""
    groups = prep.groups
    floors = {gid: st.retained_from for gid, st in groups.items()}
    away = {gid: [(g.pos_lo, g.pos_hi) for g in st.retained_away] for gid, st in groups.items()}
    found, stats = history.check_history(prep.hist_msgs, matched,
                                         {st.name: gid for gid, st in groups.items()},
                                         max_examples, floors, away)
    stats["body_digests"] = sum(len(d) for d in prep.digests.values())
    stats["ops"] = prep.nops
    return found, stats


def result(prep: Prepared, found: list[pa.Table], counts: dict[str, int],
           history_stats: dict[str, int],
           span_digests: dict[int, dict[tuple[int, int], dict[int, tuple[int, str]]]],
           deletions: dict[int, dict[int, list[control.Deletion]]]) -> AuditResult:
    """What both engines return: the findings together, what was read (``counts`` with
    the sizes of the inputs and the files by kind) and the topic deletions of the
    agreed, committed log (``agreed_deletions``)."""
    files = prep.files
    counts.update({
        "groups": len(prep.groups), "replicas": len(prep.replicas), "files": len(files),
        "bytes": sum(f.length for f in files),
        "segments": sum(f.kind == inputs.SEGMENT for f in files),
        "segment_bytes": sum(f.length for f in files if f.kind == inputs.SEGMENT),
    })
    by_kind = Counter(f.kind for f in files)
    return AuditResult(prep.replicas, files, prep.groups, checks.concat_findings(found),
                       {**counts, "files_by_kind": dict(by_kind)}, history_stats,
                       prep.timings, span_digests,
                       {gid: agreed_deletions(st, deletions[gid])
                        for gid, st in prep.groups.items()})
