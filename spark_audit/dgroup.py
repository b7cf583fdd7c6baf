"""The log-level checks of one group, on the driver, from runs instead of rows.

Pass 1 (``dlog``) returns, per group, runs of consecutive indexes of one
shape (votes of the winning version, number of versions, of versions the
history does not refute, the winner's verdicts, which replicas hold the
index and which hold the winner) with the winner at each end, the rows of
replicas that diverge where a run starts, and the rows at indexes asked for.
This module derives from them exactly what ``checks.check_group`` derives
from every row: each replica's retained range and continuity, the quorum
end and committed index (retention-aware, ``retained``), divergence inside
and beyond it, agreement runs, the sources of the committed log, the
retained-away ranges and the snapshot and Raft-index findings. A healthy
group of any length is a handful of runs, so the driver's memory does not
grow with the log.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from spark_audit import checks, dlog, hits, retained, snapshots
from spark_audit.checks import INFO, Findings, GroupState, ReplicaMeta, Version


def _version(v: list[int]) -> Version:
    return v[0], v[1], v[2], v[3]


@dataclass
class Run:
    lo: int
    hi: int
    votes: int
    nver: int
    nopen: int
    refuted: bool
    confirmed: bool
    intact: bool
    holders: int  # bit r: replica r holds the index
    match: int  # bit r: replica r holds the winning version
    first: Version  # the winner at lo
    last: Version  # the winner at hi

    def shape(self) -> tuple[int, ...]:
        return (self.votes, self.nver, self.nopen, self.refuted, self.confirmed, self.intact,
                self.holders, self.match)


@dataclass
class LogSummary:
    """One replica's log, from its segments' summaries."""

    entries: int = 0
    first: list[int] | None = None  # index, term, position, size, fid, file_offset
    last: list[int] | None = None
    min_index: int = 0


@dataclass
class GroupLog:
    """Everything pass 1 returned about one group."""

    runs: list[Run] = field(default_factory=list)
    bad: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    probe_rows: list[list[int]] = field(default_factory=list)
    probe_best: dict[int, Version] = field(default_factory=dict)
    logs: dict[int, LogSummary] = field(default_factory=dict)
    pieces: list[tuple[hits.StreamKey, int, list[hits.Hit]]] = field(default_factory=list)
    ix: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # replica -> index ranges (``dlog.LOG_CHUNK``) where its MESSAGES entries are
    # not the reference replica's (there it decodes its own records)
    diff_ref: dict[int, set[int]] = field(default_factory=dict)
    # span -> replica -> (entries, digest) (``digest``)
    digests: dict[tuple[int, int], dict[int, tuple[int, str]]] = field(default_factory=dict)

    def add_reduced(self, out: dict[str, Any], chunk: int) -> None:
        for r in out["runs"]:
            self.runs.append(Run(r[0], r[1], r[2], r[3], r[4], bool(r[5]), bool(r[6]),
                                 bool(r[7]), r[8], r[9], _version(r[10]), _version(r[11])))
        for b in out["bad"]:
            self.bad[(b[0], b[1])] = b
        self.probe_rows += out["probe_rows"]
        for p in out["probe_best"]:
            self.probe_best[p[0]] = (p[1], p[2], p[3], p[4])
        for rid, part in out["ix"].items():
            self.ix.setdefault(int(rid), []).append(part)
        for rid in out["diff_ref"]:
            self.diff_ref.setdefault(rid, set()).add(chunk)
        for lo, hi, rid, n, d in out.get("digests", []):
            self.digests.setdefault((lo, hi), {})[rid] = (n, d)

    def seal(self) -> None:
        """Sort the runs and merge neighbours of one shape (split by index ranges)."""
        merged: list[Run] = []
        for r in sorted(self.runs, key=lambda r: r.lo):
            p = merged[-1] if merged else None
            if p is not None and p.hi + 1 == r.lo and p.shape() == r.shape():
                p.hi, p.last = r.hi, r.last
            else:
                merged.append(r)
        self.runs = merged

    def best_at(self, index: int) -> Version | None:
        """The winning version at ``index`` (at a run's end or an index asked for)."""
        if index in self.probe_best:
            return self.probe_best[index]
        for r in self.runs:
            if r.lo == index:
                return r.first
            if r.hi == index:
                return r.last
        if self.present(index, index):
            raise KeyError(f"index {index}: its version was not asked for")
        return None

    def present(self, lo: int, hi: int) -> int:
        """How many indexes in ``lo..hi`` some replica holds."""
        return sum(max(0, min(hi, r.hi) - max(lo, r.lo) + 1) for r in self.runs)


def _bridge(held: list[tuple[int, int]], through: int) -> tuple[int, list[tuple[int, int]]]:
    """``retained.bridge`` over intervals of held indexes."""
    if not held:
        return 0, []
    gaps: list[tuple[int, int]] = []
    for (_, b0), (a1, _) in itertools.pairwise(held):
        lo, hi = b0 + 1, a1 - 1
        if hi > through:
            return b0, gaps
        gaps.append((lo, hi))
    return held[-1][1], gaps


def replica_log(meta: ReplicaMeta, log: LogSummary, gid: int, out: Findings) -> None:
    """``checks.check_replica_log`` without the continuity (found per file, ``dlog``)."""
    meta.entries = log.entries
    if not log.entries or log.first is None or log.last is None:
        checks.replica_bounds(meta, None, None, gid, out)
        return
    idx0, _, pos0, _, fid0, foff0 = log.first
    last_idx, last_term, last_pos, last_size, _, _ = log.last
    meta.first_index, meta.last_index, meta.last_term = idx0, last_idx, last_term
    meta.first_position, meta.last_position = pos0, last_pos
    meta.end_position = last_pos + last_size
    checks.replica_bounds(meta, (idx0, pos0, fid0, foff0), last_idx, gid, out)


def check_group(g: GroupLog, state: GroupState, max_examples: int, segment_size: int
                ) -> pa.Table:
    """``checks.check_group`` over runs: fills ``state`` the same way, same findings.

    The rules are ``checks``' (``quorum_rule`` to ``retained_ranges``); what is
    here is finding, in the runs, the indexes and versions they apply to.
    """
    out = Findings()
    gid = state.gid
    majority = len(state.replicas) // 2 + 1
    state.segment_size = checks.group_segment_size(state, segment_size)
    for rid, meta in state.replicas.items():
        replica_log(meta, g.logs.get(rid, LogSummary()), gid, out)

    limits = sorted(t for t in (m.vouched_through() for m in state.replicas.values()) if t)
    lim = np.array(limits, np.int64)
    through = retained.majority_vouched(lim, majority)
    # Split runs where the number of vouching replicas changes (after each limit).
    cuts = sorted({t + 1 for t in limits})
    sub: list[tuple[int, int, Run]] = []  # lo, hi, the run it is part of
    for r in g.runs:
        lo = r.lo
        for c in (c for c in cuts if r.lo < c <= r.hi):
            sub.append((lo, c - 1, r))
            lo = c
        sub.append((lo, r.hi, r))
    # Every index of a part has its run's votes and verdicts, and the part's vouching.
    of = [r for _, _, r in sub]
    held_mask, short_mask = checks.quorum_rule(
        np.array([r.votes for r in of], np.int64), np.array([r.nver for r in of], np.int64),
        np.array([r.nopen for r in of], np.int64), np.array([r.confirmed for r in of], bool),
        np.array([r.refuted for r in of], bool), np.array([r.intact for r in of], bool),
        retained.vouched_counts(lim, np.array([lo for lo, _, _ in sub], np.int64)), majority)
    held = retained.join_spans([(lo, hi) for (lo, hi, _), h in zip(sub, held_mask, strict=True)
                                if h])
    quorum_end, spanned = _bridge(held, through)
    if not held and state.window_lo:
        quorum_end = state.window_lo - 1  # the entries before the window were verified
    first = held[0][0] if held else 0

    def votes_at(index: int) -> int:
        return next((r.votes for r in g.runs if r.lo <= index <= r.hi), 0)

    def place_of(index: int) -> tuple[int, int] | None:
        v = g.best_at(index)
        return None if v is None else (v[1], v[2])

    checks.committed_prefix(out, state, first, quorum_end, votes_at, g.present)
    short = [(lo, min(hi, state.claimed_commit), r)
             for (lo, hi, r), s in zip(sub, short_mask, strict=True)
             if s and lo <= state.claimed_commit]
    checks.under_replicated_as_sent(out, state, short[0][0] if short else 0,
                                    sum(hi - lo + 1 for lo, hi, _ in short),
                                    short[0][2].votes if short else 0)
    c = state.committed
    agree_runs: dict[int, list[tuple[int, int]]] = {}
    for rid, meta in state.replicas.items():
        bit = 1 << rid
        bad = retained.join_spans([(r.lo, r.hi) for r in g.runs
                                   if r.holders & bit and not r.match & bit])
        inside = [(a, min(b, c)) for a, b in bad if a <= c]
        beyond = [(max(a, c + 1), b) for a, b in bad if b > c]
        checks.report_divergence(
            out, gid, meta, c, (inside[0][0] if inside else 0, _count(inside)),
            (beyond[0][0] if beyond else 0, _count(beyond)),
            functools.partial(_run_versions, g, rid))
        start = checks.agreement_start(meta, first)
        agree_runs[rid] = retained.join_spans([(max(r.lo, start), r.hi) for r in g.runs
                                               if r.holders & bit and r.match & bit
                                               and r.hi >= start])
        checks.agreement_end(out, gid, meta, agree_runs[rid], c)
    state.sources = checks.committed_sources(agree_runs, first, c, through)
    state.retained_away = checks.retained_away(out, state, spanned, max_examples, place_of,
                                               g.present)
    checks.retained_ranges(state)
    return out.table()


def _count(spans: list[tuple[int, int]]) -> int:
    """How many indexes the spans (inclusive, disjoint) hold."""
    return sum(b - a + 1 for a, b in spans)


def _run_versions(g: GroupLog, rid: int, index: int) -> tuple[checks.EntryAt, Version]:
    """Replica ``rid``'s entry at ``index`` (where its divergence starts, pass 1 returned
    the row) and the group's version there."""
    _, _, fid, foff, term, pos, size, crc = g.bad[(rid, index)]
    q = g.best_at(index)
    assert q is not None
    return (fid, foff, term, pos, size, crc), q


def check_snapshots(g: GroupLog, state: GroupState) -> pa.Table:
    """``snapshots.check_snapshots`` on the rows pass 1 returned at the snapshots' indexes."""
    rows = sorted(g.probe_rows, key=lambda r: (r[0], r[3]))
    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[], [], [], [], []]
    table = pa.table({name: pa.array(col, t) for name, col, t in zip(
        ("rid", "index", "term", "position", "size"), cols,
        (pa.int32(), pa.int64(), pa.int64(), pa.int64(), pa.int32()), strict=True)})
    return snapshots.check_snapshots(table, state)


def index_findings(g: GroupLog, state: GroupState, max_examples: int) -> pa.Table:
    """``checks.check_index_files`` per replica, from its pieces (``dlog._index_partial``)."""
    out = Findings()
    gid = state.gid
    for rid in sorted(state.replicas):
        parts = g.ix.get(rid, [])
        n_bad = sum(p["bad_crc"][0] for p in parts)
        if n_bad:
            j, fid = min((p["bad_crc"][1], p["bad_crc"][2]) for p in parts if p["bad_crc"][0])
            out.add("index_validity", "raft_index_record_crc", INFO, gid=gid, rid=rid,
                    fid=fid, index=j, count=n_bad,
                    detail=f"{n_bad} index records fail their CRC, first at index {j}")
        hits.merge([x for p in parts for x in hits.load(p["wrong"])], max_examples, out)
        n_miss = sum(p["missing"][0] for p in parts)
        if n_miss:
            j = min(p["missing"][1] for p in parts if p["missing"][0])
            out.add("index_validity", "raft_index_missing", INFO, gid=gid, rid=rid,
                    index=j, count=n_miss,
                    detail=f"{n_miss} entries have no index record (rebuilt at recovery)")
        log = g.logs.get(rid)
        floor = log.min_index if log is not None and log.entries else None
        extra = [(max(a, floor + 1) if floor is not None else a, b)
                 for p in parts for a, b in p["extra"]]
        extra = sorted((a, b) for a, b in extra if a <= b)
        n_extra = sum(b - a + 1 for a, b in extra)
        if n_extra:
            out.add("index_validity", "raft_index_beyond_log", INFO, gid=gid, rid=rid,
                    index=extra[0][0], count=n_extra,
                    detail=f"{n_extra} index records name entries not in the log")
    return out.table()


def boundary_hits(g: GroupLog, rid: int, edges: list[tuple[list[int], list[int]]],
                  seg: int, gid: int, limit: int) -> None:
    """Continuity between the last entry of a segment and the first of the next one."""
    for a, b in edges:
        rows = np.zeros(2, dlog.ROW_DTYPE)
        for j, e in enumerate((a, b)):
            rows[j]["index"], rows[j]["term"], rows[j]["position"] = e[0], e[1], e[2]
            rows[j]["size"], rows[j]["fid"], rows[j]["file_offset"] = e[3], e[4], e[5]
        h = hits.Hits(limit)
        dlog.continuity(h, rows, seg, gid, rid)
        g.pieces += hits.load(h.dump())
