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

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from spark_audit import checks, dlog, hits, retained, snapshots
from spark_audit.checks import INFO, VIOLATION, Findings, GroupState, ReplicaMeta

Version = tuple[int, int, int, int]  # term, position, size, body_crc


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


def _intervals(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with touching neighbours joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and out[-1][1] + 1 >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


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
    """``checks.check_group`` over runs: fills ``state`` the same way, same findings."""
    out = Findings()
    gid = state.gid
    n = len(state.replicas)
    majority = n // 2 + 1
    starts = sorted({s for m in state.replicas.values() for s in m.segment_starts})
    state.segment_size = segment_size or checks.infer_segment_size(starts)
    for rid, meta in state.replicas.items():
        replica_log(meta, g.logs.get(rid, LogSummary()), gid, out)

    limits = sorted(t for t in (m.vouched_through() for m in state.replicas.values()) if t)
    lim = np.array(limits, np.int64)
    through = retained.majority_vouched(lim, majority)
    # Split runs where the number of vouching replicas changes (after each limit).
    cuts = sorted({t + 1 for t in limits})
    sub: list[tuple[int, int, Run, int]] = []  # lo, hi, run, vouching replicas
    for r in g.runs:
        lo = r.lo
        for c in (c for c in cuts if r.lo < c <= r.hi):
            sub.append((lo, c - 1, r, int(retained.vouched_counts(lim, np.array([lo]))[0])))
            lo = c
        sub.append((lo, r.hi, r, int(retained.vouched_counts(lim, np.array([lo]))[0])))
    held: list[tuple[int, int]] = []
    short2: list[tuple[int, int, Run]] = []
    for lo, hi, r, vouching in sub:
        alone = r.nopen == 1
        vouched = (r.votes < majority and r.confirmed and not r.refuted and alone and r.intact)
        one_version = r.nver == 1 or (alone and r.confirmed)
        kept = (one_version and not r.refuted and r.intact and vouching > 0
                and r.votes + vouching >= majority)
        if r.votes >= majority or vouched or kept:
            held.append((lo, hi))
        if vouched and r.votes + vouching < majority:
            short2.append((lo, hi, r))
    held = _intervals(held)
    quorum_end, spanned = _bridge(held, through)
    if not held and state.window_lo:
        quorum_end = state.window_lo - 1  # the entries before the window were verified
    first = held[0][0] if held else 0
    state.first_index = first
    state.quorum_end = quorum_end
    claims = [m.hardstate.commit for m in state.replicas.values() if m.hardstate]
    state.claimed_commit = max(claims) if claims else 0
    state.committed = min(state.claimed_commit, quorum_end)
    if not claims:
        out.add("divergence", "no_hardstate", INFO, gid=gid,
                detail="no replica has a readable hardstate: no committed prefix to check")
    if state.claimed_commit > quorum_end:
        short = g.present(quorum_end + 1, state.claimed_commit)
        lo = quorum_end + 1
        have = next((r.votes for r in g.runs if r.lo <= lo <= r.hi), 0)
        out.add("lost_offsets", "under_replicated", VIOLATION, gid=gid, index=lo,
                count=state.claimed_commit - quorum_end,
                detail=f"hardstate commit {state.claimed_commit} but index {lo} is held "
                       f"identically by {have} of {n} replicas "
                       f"(majority {majority}); {short} of the claimed indexes are "
                       "present anywhere")
    cut2 = [(lo, min(hi, state.claimed_commit), r) for lo, hi, r in short2
            if lo <= state.claimed_commit]
    if cut2:
        cnt = sum(hi - lo + 1 for lo, hi, _ in cut2)
        j, _, r0 = cut2[0]
        out.add("lost_offsets", "under_replicated", VIOLATION, gid=gid, index=j, count=cnt,
                detail=f"{cnt} committed indexes from {j} are held as sent by fewer "
                       f"than {majority} of {n} replicas (index {j}: "
                       f"{r0.votes}); the other replicas' versions hold "
                       "bodies the history says were not sent (body_mismatch)")
    c = state.committed
    agree_runs: dict[int, list[tuple[int, int]]] = {}
    for rid, meta in state.replicas.items():
        bit = 1 << rid
        bad = _intervals([(r.lo, r.hi) for r in g.runs if r.holders & bit and not r.match & bit])
        inside = [(a, min(b, c)) for a, b in bad if a <= c]
        beyond = [(max(a, c + 1), b) for a, b in bad if b > c]
        if inside:
            j = inside[0][0]
            row = g.bad[(rid, j)]
            _, _, fid, foff, term, pos, size, crc = row
            q = g.best_at(j)
            assert q is not None
            out.add("divergence", "divergent_entry", VIOLATION, gid=gid, rid=rid,
                    fid=fid, file_offset=foff, index=j, phys_offset=pos,
                    count=sum(b - a + 1 for a, b in inside),
                    detail=f"first divergent index {j}: replica has (term {term}, "
                           f"position {pos}, size {size}, crc "
                           f"{crc:#010x}), quorum has (term {q[0]}, position "
                           f"{q[1]}, size {q[2]}, crc {q[3]:#010x})")
            meta.first_divergent = j
        if beyond:
            out.add("divergence", "uncommitted_divergence", INFO, gid=gid, rid=rid,
                    index=beyond[0][0], count=sum(b - a + 1 for a, b in beyond),
                    detail=f"differs from the majority from index {beyond[0][0]}, beyond the "
                           f"committed index {c} (Raft may still truncate it)")
        start = max(first, meta.first_index) if meta.trimmed and first else first
        meta.agree_start = start
        agree = _intervals([(max(r.lo, start), r.hi) for r in g.runs
                            if r.holders & bit and r.match & bit and r.hi >= start])
        if agree and agree[0][0] == start:
            meta.agree_end = agree[0][1]
        else:
            meta.agree_end = start - 1 if start else 0
        agree_runs[rid] = agree
        if meta.agree_end < c and meta.agree_end == meta.last_index:
            out.add("divergence", "lagging_replica", INFO, gid=gid, rid=rid,
                    index=meta.agree_end + 1, count=c - meta.agree_end,
                    detail=f"replica ends at {meta.last_index}, committed index is {c}")
    sources: list[tuple[int, int, int]] = []
    lo = first
    while c and first and lo <= c:
        cands = [(b, -rid) for rid, rr in agree_runs.items() for a, b in rr if a <= lo <= b]
        if not cands:
            resume = [a for rr in agree_runs.values() for a, _ in rr if a > lo]
            if lo > through or not resume:
                break
            lo = min(resume)
            continue
        b, neg = max(cands)
        hi = min(b, c)
        sources.append((lo, hi, -neg))
        lo = hi + 1
    state.sources = sources
    state.retained_away = _retained_away(out, state, spanned, g, max_examples)
    holding = [m for m in state.replicas.values() if m.entries]
    if holding:
        state.retained_first = min(m.first_index for m in holding)
        state.retained_from = min(m.claimed_start for m in holding)
        lo, hi = max(m.first_index for m in holding), min(m.last_index for m in holding)
        if lo <= hi:
            state.shared_first, state.shared_last = lo, hi
    return out.table()


def _retained_away(out: Findings, state: GroupState, spanned: list[tuple[int, int]],
                   g: GroupLog, max_examples: int) -> list[retained.Gap]:
    """``checks._retained_away`` with the group's versions looked up in the runs."""
    holds = [span for m in state.replicas.values() if (span := m.should_hold()) is not None]
    reps = sorted(state.replicas.values(), key=lambda m: m.rid)
    ends = [(sf.meta.end_position, sf.meta.index) for m in reps for sf in m.snapshots.values()
            if sf.usable() and sf.meta is not None]
    gaps: list[retained.Gap] = []
    for glo, ghi in spanned:
        for lo, hi in retained.outside_spans(glo, ghi, holds):
            before = g.best_at(lo - 1)
            pos_lo = before[1] + before[2] if before is not None else 0
            after = g.best_at(hi + 1)
            if after is not None:
                pos_hi = after[1]
            else:
                pos_hi = max([e for e, i in ends if i <= hi] + [pos_lo])
            who = tuple(m.rid for m in reps if m.vouched_through() >= hi)
            gaps.append(retained.Gap(lo, hi, pos_lo, max(pos_hi, pos_lo), who))
            if len(gaps) > max_examples:
                continue
            names = ", ".join(m.name for m in reps if m.rid in who)
            copies = g.present(lo, hi)
            on = (f"{copies} of them only as copies that do not count (damaged, or "
                  "refuted by the history), past a replica's durable point") if copies else (
                "on no replica")
            out.add("lost_offsets", "retained_away", INFO, gid=state.gid, index=lo,
                    phys_offset=pos_lo, count=hi - lo + 1,
                    detail=f"indexes {lo}..{hi} (positions {pos_lo}..{pos_hi}), {on}: "
                           f"committed, and removed by retention on {names} ({len(who)} of "
                           f"{len(reps)}, their snapshots cover them); no replica should "
                           "still hold them")
    if len(gaps) > max_examples:
        out.add("lost_offsets", "retained_away", INFO, gid=state.gid,
                count=sum(g.hi - g.lo + 1 for g in gaps[max_examples:]),
                detail=f"{len(gaps) - max_examples} further ranges not listed")
    return gaps


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
