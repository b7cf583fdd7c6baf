"""What both ways of running the audit share: options, result, and the start.

``prepare`` discovers the files, decodes the small ones (checkpoint,
hardstate, dispatch checkpoint, snapshot metas) into each replica's
``checks.ReplicaMeta`` and reads the history; ``audit.run_audit`` (every
array on the driver) and ``distributed.run`` (keyed passes, the driver gets
findings) both go on from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_audit import checks, control, digest, engine, fmt, history, inputs, window
from spark_audit.checks import INFO, VIOLATION, Findings

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
    replicas_ = inputs.parse_group_specs(opts.specs, eng.lister)
    files = inventory = inputs.inventory(replicas_, eng.lister)
    tm["discover_s"] = time.perf_counter() - t0
    out = Findings()

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
            kind = ("implausible_value" if isinstance(exc, fmt.ImplausibleValue)
                    else f"bad_{f.kind}")
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
        elif f.kind == inputs.OTHER:
            out.add("corruption", "unknown_file", INFO, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path} is not part of the format (reported, not read)")
    tm["read_small_s"] = time.perf_counter() - t1
    if opts.bounds:
        if opts.history:
            raise ValueError("the history check needs the whole log: --history cannot be "
                             "combined with --cut or --from")
        t2 = time.perf_counter()
        files = window.apply(opts.bounds, eng, inventory, groups, opts.max_entry_size)
        tm["window_s"] = time.perf_counter() - t2
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
        for d, t in known or []:
            if (d, t) not in agreed and 0 < d <= m.dispatched_on_disk:
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


