"""The cut and the window: which part of each replica's files an audit reads.

``--cut GROUP=HI`` audits a group only up to Raft index HI: a live broker
keeps appending past it, so segment bytes past the end of entry HI and
ConsumeQueue units pointing past it are neither read nor judged (a torn
tail or a half-written unit beyond the cut is no finding). ``--from
GROUP=LO`` starts the audit at index LO: the entries before it are treated
as a prefix verified before, much as a prefix retention removed, and files
wholly below the window are not read. Together they make the window
``[LO, HI]`` the nightly audit (``nightly``) reads, one range at a time.

Where the window lies in each replica's files is found by the driver with a
few small reads (``Engine.read_range``), never by reading the log:

1. the replica's first entry on disk: the header at the start of its first
   segment (retention and the start checks are judged on it);
2. the entry at LO and at HI: the Raft-index record of that index (32 bytes
   at a fixed offset), confirmed by the entry header it points at (magic,
   header CRC, self-recorded position, index, term, size). When the record
   is missing, damaged or stale (index files are derived data), the first
   header of each segment says which segment holds the index and that
   segment's headers are walked (``parse.scan_segment`` without body CRCs).

The result is an ``inputs.View`` per file: a segment is read from the
header of the first entry at or after LO to the end of entry HI; a
Raft-index file from the record of LO to the record of HI; a ConsumeQueue
file whole, its units outside the positions of the window dropped as it is
parsed; files wholly outside are left out. Each replica's ``ReplicaMeta``
learns its window (``window_lo``, ``cut``, where the view reads), the first
entry on disk (``disk_first``), and its hardstate commit, durable index and
dispatched index are clamped to the cut (a live broker's are past it).

Past a cut, one more small read per replica: the topic deletions between the
cut and what the replica dispatched (``ReplicaLog.deletions_past``, through
the Raft-index records' kinds and the CONTROL bodies), because a live broker
that applies one after the cut drops that topic's queues before the audit
reads them (``prepare.dead_before``).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np

from spark_audit import checks, control, fmt, inputs, parse
from spark_audit.engine import Engine
from spark_audit.inputs import FileInfo, View

MAX_INDEX = fmt.MAX_PLAUSIBLE
# Entries past a cut read for topic deletions, per replica (32 bytes of
# Raft-index record each, on the driver): a live cut is a few seconds behind.
DELETION_SCAN_MAX = 200_000


@dataclass(frozen=True)
class Bounds:
    """The window of one group: indexes ``lo..hi`` (``hi`` 0: up to the files' end)."""

    lo: int = 1
    hi: int = 0

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi or 'end'}"


def parse_specs(specs: list[str], what: str) -> dict[str, int]:
    """``GROUP=INDEX`` options (``--cut``, ``--from``) as group -> index."""
    out: dict[str, int] = {}
    for spec in specs:
        group, sep, value = spec.rpartition("=")
        if not sep or not group:
            raise ValueError(f"{what} {spec!r}: expected GROUP=INDEX")
        try:
            index = int(value, 10)
        except ValueError:
            raise ValueError(f"{what} {spec!r}: {value!r} is not a Raft index") from None
        if not 1 <= index <= MAX_INDEX:
            raise ValueError(f"{what} {spec!r}: the index must be in 1..2^63-1")
        if group in out:
            raise ValueError(f"{what} names group {group!r} twice")
        out[group] = index
    return out


def bounds_from_options(cuts: list[str], starts: list[str]) -> dict[str, Bounds]:
    """``--cut`` and ``--from`` options as each group's ``Bounds``."""
    hi = parse_specs(cuts, "--cut")
    lo = parse_specs(starts, "--from")
    out = {}
    for group in sorted(set(hi) | set(lo)):
        b = Bounds(lo.get(group, 1), hi.get(group, 0))
        if b.hi and b.lo > b.hi:
            raise ValueError(f"group {group}: --from {b.lo} is above --cut {b.hi}")
        out[group] = b
    return out


# ------------------------------------------------------------------ one replica


Entry = tuple[int, int, int]  # index, position, size


class ReplicaLog:
    """One replica's segments and Raft-index files, read a few bytes at a time."""

    def __init__(self, eng: Engine, files: list[FileInfo], max_entry_size: int) -> None:
        self.eng = eng
        self.max_entry_size = max_entry_size
        self.segs = sorted((f for f in files if f.kind == inputs.SEGMENT), key=lambda f: f.start)
        self.index = sorted((f for f in files if f.kind == inputs.INDEX), key=lambda f: f.start)
        self._firsts: dict[int, tuple[int, int, int] | None] = {}

    def header(self, seg: FileInfo, offset: int) -> tuple[int, int, int] | None:
        """(index, term, size) of a valid entry header at ``offset`` of ``seg``."""
        if offset < 0 or offset + fmt.ENTRY_HEADER_SIZE > seg.length:
            return None
        data = self.eng.read_range(seg.path, offset, fmt.ENTRY_HEADER_SIZE)
        if len(data) < fmt.ENTRY_HEADER_SIZE:
            return None
        magic, _v, _k, _f, size, _c, index, term, position, _r = fmt.ENTRY_HEADER.unpack_from(
            data)
        if (magic != fmt.ENTRY_MAGIC
                or fmt.crc(data[:fmt.ENTRY_HEADER_CRC_AT]) != struct.unpack_from(
                    "<I", data, fmt.ENTRY_HEADER_CRC_AT)[0]
                or position != seg.start + offset
                or not fmt.ENTRY_HEADER_SIZE <= size <= self.max_entry_size
                or not 1 <= index <= MAX_INDEX or not 1 <= term <= MAX_INDEX):
            return None
        return index, term, size

    def first_of(self, seg: FileInfo) -> tuple[int, int, int] | None:
        if seg.fid not in self._firsts:
            self._firsts[seg.fid] = self.header(seg, 0)
        return self._firsts[seg.fid]

    def first(self) -> tuple[int, int, int] | None:
        """(index, position, file id) of the first entry on disk; None when the first
        segment does not start with a valid header (or there is none)."""
        if not self.segs:
            return None
        h = self.first_of(self.segs[0])
        return (h[0], self.segs[0].start, self.segs[0].fid) if h is not None else None

    def seek(self, x: int) -> Entry | None:
        """The first entry (in log order) whose index is at least ``x``; None if none."""
        return self._by_record(x) or self._by_walk(x)

    def _seg_at(self, position: int) -> FileInfo | None:
        for s in self.segs:
            if s.start <= position < s.start + s.length:
                return s
        return None

    def _by_record(self, x: int) -> Entry | None:
        """The Raft-index record of ``x``, confirmed by the header it points at."""
        ix = next((f for f in reversed(self.index) if f.start <= x), None)
        if ix is None:
            return None
        off = (x - ix.start) * fmt.INDEX_RECORD_SIZE
        if off + fmt.INDEX_RECORD_SIZE > ix.length:
            return None
        rec = self.eng.read_range(ix.path, off, fmt.INDEX_RECORD_SIZE)
        if len(rec) < fmt.INDEX_RECORD_SIZE or fmt.crc(rec[:28]) != struct.unpack_from(
                "<I", rec, 28)[0]:
            return None
        position, term, size, _kind, _bcrc = fmt.INDEX_RECORD.unpack_from(rec)
        seg = self._seg_at(position) if position <= MAX_INDEX else None
        if seg is None:
            return None
        h = self.header(seg, position - seg.start)
        return (x, position, size) if h == (x, term, size) else None

    def _by_walk(self, x: int) -> Entry | None:
        """Walk the headers of the segment the first headers say holds ``x`` (and on)."""
        at = 0
        for k, seg in enumerate(self.segs):
            h = self.first_of(seg)
            if h is not None and h[0] <= x:
                at = k
        for seg in self.segs[at:]:
            rows = self.walk(seg)
            hit = rows[rows["index"] >= x]
            if len(hit):
                return int(hit["index"][0]), int(hit["position"][0]), int(hit["size"][0])
        return None

    def walk(self, seg: FileInfo) -> np.ndarray:
        """Every valid entry header of one segment (``parse.ENTRY_DTYPE``)."""
        data = self.eng.read_range(seg.path, 0, seg.length)
        return parse.scan_segment(data, seg.start, self.max_entry_size, bodies=False).entries

    def deletions_past(self, hi: int, upto: int, limit: int) -> list[control.Deletion] | None:
        """The ``topic.delete`` ops of entries ``hi+1..upto`` (past a cut, up to
        what the replica dispatched), found through their Raft-index records
        (one read per index file; a record's kind says which entries are
        CONTROL) and read from the CONTROL entries' bodies, each confirmed by
        its header and body CRC. None when that cannot be told: more than
        ``limit`` entries, or a record or CONTROL entry missing or damaged
        (index files are derived data)."""
        if not self.index:
            return None
        # A broker's index file grows after the listing; what it held then
        # covers every deletion whose dropped queues the listing can miss (the
        # record is written when the entry is appended, before it is applied).
        upto = min(upto, max(ix.start + ix.length // fmt.INDEX_RECORD_SIZE - 1
                             for ix in self.index))
        if upto - hi > limit:
            return None
        out: list[control.Deletion] = []
        x = hi + 1
        while x <= upto:
            ix = next((f for f in reversed(self.index) if f.start <= x), None)
            if ix is None:
                return None
            n = min(upto + 1, ix.start + ix.length // fmt.INDEX_RECORD_SIZE) - x
            if n <= 0:
                return None
            raw = self.eng.read_range(ix.path, (x - ix.start) * fmt.INDEX_RECORD_SIZE,
                                      n * fmt.INDEX_RECORD_SIZE)
            if len(raw) < n * fmt.INDEX_RECORD_SIZE:
                return None
            for k in range(n):
                rec = raw[k * fmt.INDEX_RECORD_SIZE:(k + 1) * fmt.INDEX_RECORD_SIZE]
                if fmt.crc(rec[:28]) != struct.unpack_from("<I", rec, 28)[0]:
                    return None
                position, term, size, kind, bcrc = fmt.INDEX_RECORD.unpack_from(rec)
                if kind != fmt.KIND_CONTROL:
                    continue
                body = self._control_body(x + k, position, term, size, bcrc)
                if body is None:
                    return None
                out += control.body_deletions(x + k, body)
            x += n
        return out

    def _control_body(self, index: int, position: int, term: int, size: int,
                      bcrc: int) -> bytes | None:
        seg = self._seg_at(position) if position <= MAX_INDEX else None
        if seg is None or self.header(seg, position - seg.start) != (index, term, size):
            return None
        body = self.eng.read_range(seg.path, position - seg.start + fmt.ENTRY_HEADER_SIZE,
                                   size - fmt.ENTRY_HEADER_SIZE)
        ok = len(body) == size - fmt.ENTRY_HEADER_SIZE and fmt.crc(body) == bcrc
        return body if ok else None

    def last_index(self) -> int:
        """The highest index in the last segment holding entries (0: none)."""
        for seg in reversed(self.segs):
            rows = self.walk(seg)
            if len(rows):
                return int(rows["index"].max())
        return 0


@dataclass
class Placed:
    """Where one replica's view lies."""

    first: tuple[int, int, int] | None  # the first entry on disk (index, position, file id)
    read_from: int | None = None  # position of the first entry at or after lo (a window)
    read_to: int | None = None  # position past entry hi (a cut)
    empty: str = ""  # "below": the log ends before lo; "above": it starts after hi
    holds_cut: bool = False  # the replica holds an entry at or past hi


def place(log: ReplicaLog, b: Bounds) -> Placed:
    """Find where the window ``b`` lies in one replica's log."""
    first = log.first()
    p = Placed(first)
    if b.lo > 1 and first is not None and first[0] < b.lo:
        hit = log.seek(b.lo)
        if hit is None:
            p.empty = "below"
        else:
            p.read_from = hit[1]
    if b.hi and log.segs:
        hit = log.seek(b.hi)
        if hit is not None:
            p.holds_cut = True
            # The end of entry hi; or, where hi is missing, the first entry past it.
            p.read_to = hit[1] + hit[2] if hit[0] == b.hi else hit[1]
            if first is not None and first[0] > b.hi:
                p.empty = "above"
    return p


# ------------------------------------------------------------------- the views


# Every view ends where the file ended when it was listed (``f.length``): a live
# broker appends to its last segment and ConsumeQueue files meanwhile, and every
# pass of the audit must read the same bytes.


def _segment_view(f: FileInfo, p: Placed) -> FileInfo | None:
    end = f.start + f.length
    if p.empty or (p.read_from is not None and end <= p.read_from) or (
            p.read_to is not None and f.start >= p.read_to):
        return None
    start = p.read_from - f.start if p.read_from is not None and f.start <= p.read_from else 0
    stop = p.read_to - f.start if p.read_to is not None and p.read_to < end else f.length
    return dataclasses.replace(f, view=View(start, stop), length=stop - start)


def _index_view(f: FileInfo, p: Placed, b: Bounds) -> FileInfo | None:
    n = f.length // fmt.INDEX_RECORD_SIZE
    last = f.start + n - 1
    if p.empty or (n and last < b.lo) or (b.hi and f.start > b.hi):
        return None
    start = (b.lo - f.start) * fmt.INDEX_RECORD_SIZE if n and b.lo > f.start else 0
    stop = (b.hi - f.start + 1) * fmt.INDEX_RECORD_SIZE if b.hi and b.hi < last else f.length
    return dataclasses.replace(f, view=View(start, stop), length=stop - start)


def _first_unit_at(eng: Engine, f: FileInfo, n: int, position: int) -> int | None:
    """The first slot (of ``n``) whose unit points at or past ``position``: a binary
    search, units increasing along a queue; None when a probe finds an empty slot
    (a hole: the order cannot be trusted, the file is read whole)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        offset, size, tag = fmt.CQ_UNIT.unpack(eng.read_range(
            f.path, mid * fmt.CQ_UNIT_SIZE, fmt.CQ_UNIT_SIZE))
        if not (offset or size or tag):
            return None
        if offset >= position:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _cq_view(eng: Engine, f: FileInfo, p: Placed, b: Bounds) -> FileInfo | None:
    """A ConsumeQueue file read only over the slots whose units point into the window
    (found by binary search, units increasing along a queue), its units outside
    dropped as it is parsed; None when no unit of it points into the window."""
    if p.empty:
        return None
    pos_lo, pos_hi = p.read_from or 0, -1 if p.read_to is None else p.read_to
    n = f.length // fmt.CQ_UNIT_SIZE
    start, stop = 0, f.length
    lo_k = _first_unit_at(eng, f, n, pos_lo) if pos_lo and n else 0
    hi_k = _first_unit_at(eng, f, n, pos_hi) if pos_hi >= 0 and n else n
    if lo_k is not None and hi_k is not None:
        # No unit points into the window (a trailing partial unit without a cut is
        # judged: the file is kept for it).
        if lo_k >= hi_k and (pos_hi >= 0 or f.length % fmt.CQ_UNIT_SIZE == 0):
            return None
        start = lo_k * fmt.CQ_UNIT_SIZE
        if pos_hi >= 0:
            stop = hi_k * fmt.CQ_UNIT_SIZE  # a trailing partial unit is past it too
    v = View(start, stop, pos_lo, pos_hi, open_tail=bool(b.hi))
    return dataclasses.replace(f, view=v, length=stop - start)


def _past_cut_deletions(st: checks.GroupState, log: ReplicaLog, m: checks.ReplicaMeta,
                        hi: int) -> None:
    """Topic deletions past the cut that this replica applied (its dispatch
    checkpoint, before the cut clamps it, is past them, or just below one
    and without the topic: they are committed): it dropped those topics'
    queues, and their messages below the cut are dead on it
    (``prepare.dead_before``), not unindexed. A live
    broker that applies a deletion between the cut and the audit's reads
    would otherwise look like it lost units. When they cannot be read
    (``ReplicaLog.deletions_past``), ``deletions_past_cut_unread`` says so."""
    upto = m.dispatch.dispatched_index if m.dispatch is not None else 0
    if upto < hi:
        return  # behind the cut: it applied nothing past it
    found = log.deletions_past(hi, upto, DELETION_SCAN_MAX)
    if found is None:
        st.past_cut_unread.append(m.rid)
        return
    # The entry after: a broker dropping a topic's queues writes a checkpoint
    # just below the deleting entry (``prepare.dead_before``); best effort.
    found += log.deletions_past(upto, upto + 1, 1) or []
    st.past_cut_deletions = sorted(set(st.past_cut_deletions) | set(found))


def _clamp(m: checks.ReplicaMeta, hi: int) -> None:
    """A live broker's hardstate, checkpoint and dispatch checkpoint run past the cut."""
    if m.hardstate is not None:
        m.hardstate = dataclasses.replace(m.hardstate, commit=min(m.hardstate.commit, hi))
    if m.checkpoint is not None:
        m.checkpoint = dataclasses.replace(m.checkpoint, durable_index=min(
            m.checkpoint.durable_index, hi))
    if m.dispatch is not None:
        m.dispatched_before_cut = m.dispatch.dispatched_index
        m.dispatch = dataclasses.replace(m.dispatch, dispatched_index=min(
            m.dispatch.dispatched_index, hi))


def apply(bounds: dict[str, Bounds], eng: Engine, files: list[FileInfo],
          groups: dict[int, checks.GroupState], max_entry_size: int) -> list[FileInfo]:
    """The files an audit with ``bounds`` reads, with their views; fills each bounded
    group's ``GroupState`` and ``ReplicaMeta`` window fields.

    Raises ``ValueError`` for a group no spec names, and for a cut above what
    the group's files hold (naming both).
    """
    by_name = {st.name: st for st in groups.values()}
    unknown = sorted(set(bounds) - set(by_name))
    if unknown:
        raise ValueError(f"--cut/--from name group(s) {', '.join(unknown)}, not among the "
                         f"groups audited ({', '.join(sorted(by_name))})")
    kept: list[FileInfo] = []
    by_replica: dict[tuple[int, int], list[FileInfo]] = {}
    for f in files:
        by_replica.setdefault((f.gid, f.rid), []).append(f)
    for gid, st in groups.items():
        b = bounds.get(st.name)
        mine = [f for rid in st.replicas for f in by_replica.get((gid, rid), [])]
        if b is None or (b.lo <= 1 and not b.hi):
            kept += mine
            continue
        st.window_lo = b.lo if b.lo > 1 else 0
        st.cut = b.hi
        logs = {rid: ReplicaLog(eng, by_replica.get((gid, rid), []), max_entry_size)
                for rid in st.replicas}
        placed = {rid: place(log, b) for rid, log in logs.items()}
        if b.hi and not any(p.holds_cut for p in placed.values()):
            top = max((log.last_index() for log in logs.values()), default=0)
            raise ValueError(f"--cut {st.name}={b.hi} is above what the files of group "
                             f"{st.name} hold: their highest Raft index is {top}")
        for rid, m in st.replicas.items():
            p = placed[rid]
            m.window_lo = b.lo if (p.read_from is not None or p.empty == "below") else 0
            m.view_empty = p.empty
            m.disk_first = p.first
            m.read_from = -1 if p.read_from is None else p.read_from
            m.read_to = -1 if p.read_to is None else p.read_to
            if b.hi:
                m.cut = b.hi
                _past_cut_deletions(st, logs[rid], m, b.hi)
                _clamp(m, b.hi)
            for f in by_replica.get((gid, rid), []):
                view: FileInfo | None = f
                if f.kind == inputs.SEGMENT:
                    view = _segment_view(f, p)
                elif f.kind == inputs.INDEX:
                    view = _index_view(f, p, b)
                elif f.kind == inputs.CQ:
                    view = _cq_view(eng, f, p, b)
                if view is not None:
                    kept.append(view)
    return sorted(kept, key=lambda f: f.fid)
