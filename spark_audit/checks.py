"""The audit's checks, as plain functions over Arrow tables.

Six checks, each producing rows of ``FINDING_SCHEMA``:

- ``corruption``: CRC, magic, size and record-layout failures, with file and offset.
- ``lost_offsets``: Raft index / position / term anomalies along one replica's
  log, durable or committed entries missing, under-replicated committed
  entries (counting the replicas whose retention vouches for them,
  ``retained``), committed ranges retention removed from every replica
  (``retained_away``, info), ConsumeQueue holes, acknowledged sends not in
  the log.
- ``divergence``: a replica whose committed prefix differs from the quorum.
- ``duplicates``: one client identity at two positions, a message indexed
  twice, a ConsumeQueue slot pointing at different messages on two replicas.
- ``index_validity``: ConsumeQueue units against the messages they point at,
  and Raft-index files against the entries.
- ``history``: client histories against the committed log.

A finding has a severity: ``violation`` fails the check; ``info`` is reported
(for example divergence beyond the committed prefix, which Raft allows).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit import fmt, retained

CHECKS = ("corruption", "lost_offsets", "divergence", "duplicates", "index_validity", "history")
VIOLATION, INFO = "violation", "info"

FINDING_SCHEMA = pa.schema([
    ("check", pa.string()),
    ("kind", pa.string()),
    ("severity", pa.string()),
    ("gid", pa.int32()),
    ("rid", pa.int32()),
    ("fid", pa.int32()),
    ("file_offset", pa.int64()),
    ("index", pa.int64()),
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("slot", pa.int64()),
    ("phys_offset", pa.int64()),
    ("count", pa.int64()),
    ("detail", pa.string()),
])



class FindingRow(TypedDict):
    """One row of ``FINDING_SCHEMA``, as ``Findings`` collects it."""

    check: str
    kind: str
    severity: str
    gid: int
    rid: int
    fid: int
    file_offset: int
    index: int
    topic: str
    queue_id: int
    slot: int
    phys_offset: int
    count: int
    detail: str


class QueueAt(TypedDict, total=False):
    """Where findings about one ConsumeQueue are (keyword arguments of ``Findings.add``)."""

    gid: int
    rid: int
    topic: str
    queue_id: int


# Parse problems and the check they belong to; anything else is corruption.
PROBLEM_CHECK = {"torn_tail": "corruption"}


class Findings:
    """Collects findings; ``count`` lets one row stand for a run of anomalies."""

    def __init__(self) -> None:
        self.rows: list[FindingRow] = []

    def add(self, check: str, kind: str, severity: str, *, gid: int = -1, rid: int = -1,
            fid: int = -1, file_offset: int = -1, index: int = -1, topic: str = "",
            queue_id: int = -1, slot: int = -1, phys_offset: int = -1, count: int = 1,
            detail: str = "") -> None:
        assert check in CHECKS, check
        self.rows.append(FindingRow(check=check, kind=kind, severity=severity, gid=gid, rid=rid,
                                    fid=fid, file_offset=file_offset, index=index, topic=topic,
                                    queue_id=queue_id, slot=slot, phys_offset=phys_offset,
                                    count=count, detail=detail))

    def table(self) -> pa.Table:
        return findings_table(self.rows)


def findings_table(rows: list[FindingRow]) -> pa.Table:
    if not rows:
        return FINDING_SCHEMA.empty_table()
    return pa.Table.from_pylist(rows, schema=FINDING_SCHEMA)


def concat_findings(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else FINDING_SCHEMA.empty_table()


# --------------------------------------------------------------------------- log


@dataclass
class SnapshotFiles:
    """One ``snapshots/<index>/`` directory of a replica, as read."""

    index: int  # from the directory's name
    meta: fmt.SnapshotMeta | None = None  # None: missing or unreadable (reported)
    meta_fid: int = -1
    state_fid: int = -1  # -1: no state file
    state_length: int = 0
    state_crc: int = 0

    def usable(self) -> bool:
        """The snapshot can restore a state: meta decoded, named right, state verified."""
        m = self.meta
        return (m is not None and m.index == self.index and self.state_fid >= 0
                and self.state_length == m.state_bytes and self.state_crc == m.state_crc)


@dataclass
class ReplicaMeta:
    """What the small files of one replica say, and what the audit derived."""

    rid: int
    name: str
    checkpoint: fmt.Checkpoint | None = None
    hardstate: fmt.HardState | None = None
    dispatch: fmt.DispatchCheckpoint | None = None
    identity: fmt.Identity | None = None  # None: no IDENTITY, or an unreadable one (reported)
    segment_starts: list[int] = field(default_factory=list)
    snapshots: dict[int, SnapshotFiles] = field(default_factory=dict)
    # Filled by check_group:
    entries: int = 0
    first_index: int = 0
    last_index: int = 0
    last_term: int = 0
    # The retained range on disk: first entry's position, last entry's
    # position, and the position just past it (-1, -1, 0 for an empty log).
    first_position: int = -1
    last_position: int = -1
    end_position: int = 0
    # The log starts after index 1 where its checkpoint says it does:
    # retention (or a snapshot install) removed the prefix, not a fault.
    trimmed: bool = False
    # Where this replica's log should start: its first entry's position, or 0
    # when its checkpoint says index 1 is still on disk but it is gone.
    claimed_start: int = -1
    agree_start: int = 0  # first index this replica is compared from
    agree_end: int = 0  # last index up to which this replica matches the quorum
    first_divergent: int = 0  # 0 = none within the committed prefix
    # Set by ``window`` when the audit reads part of the log only (a cut, a window):
    window_lo: int = 0  # > 0: the view starts at this index, the entries before were verified
    cut: int = 0  # > 0: audited up to this index; snapshots past it are not judged
    # (index, position, file id) of the first entry on disk, when the view does not
    # start there; the start checks (retention, snapshots) are about the disk's log.
    disk_first: tuple[int, int, int] | None = None
    # A view without entries: "below" (the log ends before the window), "above" (it
    # starts after it), "" otherwise.
    view_empty: str = ""
    read_from: int = -1  # the first log position the view reads (-1: the log's start)
    read_to: int = -1  # the log position the view stops at (-1: the log's end)
    # Filled by ``replica_bounds``: where the log on disk starts, and whether that is
    # where retention (or an install) left it, with its checkpoint's consent.
    start_index: int = 0
    start_position: int = -1
    retention_cut: bool = False

    @property
    def dispatched_on_disk(self) -> int:
        """The dispatch checkpoint's index as read, before a cut clamped it (0: none)."""
        if self.dispatch is None:
            return 0
        return self.dispatched_before_cut or self.dispatch.dispatched_index

    # Set by ``window`` when a cut clamps the dispatch checkpoint: its index as read.
    dispatched_before_cut: int = 0

    def valid_snapshots(self) -> list[fmt.SnapshotMeta]:
        """Snapshots whose meta decoded, oldest first (their state is checked apart)."""
        return [s.meta for _, s in sorted(self.snapshots.items()) if s.meta is not None]

    def newest_usable(self) -> fmt.SnapshotMeta | None:
        """The newest usable snapshot (what this replica's broker would restore)."""
        for _, snap in sorted(self.snapshots.items(), reverse=True):
            if snap.usable() and snap.meta is not None:
                return snap.meta
        return None

    def vouched_through(self) -> int:
        """The last index this replica's retention vouches for (``retained``), 0 for none.

        A log cut at F (``trimmed``) with a usable snapshot at S held every index
        up to min(F - 1, S), and each of them was committed: the broker
        snapshots only applied entries, and retention removes only what a
        snapshot covers.
        """
        snap = self.newest_usable() if self.retention_cut else None
        return min(self.start_index - 1, snap.index) if snap is not None else 0

    def should_hold(self) -> tuple[int, int] | None:
        """The index range this replica's files say it holds: from its checkpoint's
        first index (its first entry when retention cut it) to its last entry,
        but not past its durable index: a crash may leave the tail beyond that
        damaged (``torn_tail``), and recovery cuts it."""
        if not self.entries:
            return None
        cp = self.checkpoint
        if cp is None:
            return self.first_index, self.last_index
        start = self.first_index if self.trimmed else min(self.first_index,
                                                          max(cp.first_index, 1))
        end = min(self.last_index, cp.durable_index)
        return (start, end) if start <= end else None


@dataclass
class GroupState:
    """Outcome of the log-level checks of one group, used by the later checks."""

    gid: int
    name: str
    replicas: dict[int, ReplicaMeta]
    segment_size: int = 0
    claimed_commit: int = 0
    quorum_end: int = 0
    committed: int = 0
    first_index: int = 0
    # (lo, hi, rid): committed indexes lo..hi are read from replica rid.
    sources: list[tuple[int, int, int]] = field(default_factory=list)
    # The range every replica holding entries keeps: [max first, min last]
    # (0, 0 when they share nothing).
    shared_first: int = 0
    shared_last: int = 0
    # The lowest index any replica still holds, and the lowest position any
    # replica holds or should hold (see ``ReplicaMeta.claimed_start``): below
    # that position retention removed the log everywhere (0: nothing removed).
    retained_first: int = 0
    retained_from: int = 0
    # Committed indexes no replica holds or should hold, which a majority's
    # retention removed after a snapshot (``retained``).
    retained_away: list[retained.Gap] = field(default_factory=list)
    # The audited window (``window``): from ``window_lo`` (0: the log's start; the
    # entries before were verified before) up to the cut ``cut`` (0: the files' end).
    window_lo: int = 0
    cut: int = 0
    # Topic deletions in entries past the cut that replicas applied (their
    # dispatch checkpoints run past them), read by ``window``: committed, and
    # their topics' queues are gone from those replicas (``prepare.dead_before``).
    past_cut_deletions: list[tuple[int, str]] = field(default_factory=list)
    # Replicas whose deletions past the cut could not be read (``window``).
    past_cut_unread: list[int] = field(default_factory=list)


def infer_segment_size(starts: list[int]) -> int:
    """Segment size from segment file names: their gcd (0 when only segment 0 exists)."""
    g = 0
    for s in starts:
        g = math.gcd(g, s)
    return g


def place(end: np.ndarray, size: np.ndarray, seg: int) -> np.ndarray:
    """The placement rule of the format, vectorized; ``seg`` 0 means no rollover seen."""
    if seg <= 0:
        return end
    return np.where(end % seg + size > seg, (end // seg + 1) * seg, end)


def _examples(mask: np.ndarray) -> np.ndarray:
    return np.nonzero(mask)[0]


def check_replica_log(e: pd.DataFrame, meta: ReplicaMeta, gid: int, seg: int,
                      out: Findings, max_examples: int) -> None:
    """Continuity along one replica's log (entries sorted by position)."""
    rid = meta.rid
    meta.entries = len(e)
    if not len(e):
        replica_bounds(meta, None, None, gid, out)
        return
    idx = e["index"].to_numpy()
    term = e["term"].to_numpy()
    pos = e["position"].to_numpy()
    size = e["size"].to_numpy().astype(np.int64)
    fid = e["fid"].to_numpy()
    foff = e["file_offset"].to_numpy()
    meta.first_index, meta.last_index, meta.last_term = int(idx[0]), int(idx[-1]), int(term[-1])
    meta.first_position, meta.last_position = int(pos[0]), int(pos[-1])
    meta.end_position = int(pos[-1] + size[-1])

    for check, kind, mask, text in continuity_rules(idx, term, pos, size, seg):
        hits = _examples(mask)
        for j in hits[:max_examples]:
            out.add(check, kind, VIOLATION, gid=gid, rid=rid, fid=int(fid[j + 1]),
                    file_offset=int(foff[j + 1]), index=int(idx[j + 1]),
                    phys_offset=int(pos[j + 1]), detail=text(j))
        if len(hits) > max_examples:
            out.add(check, kind, VIOLATION, gid=gid, rid=rid, index=int(idx[hits[max_examples]]),
                    count=len(hits) - max_examples, detail="further occurrences not listed")
    replica_bounds(meta, (int(idx[0]), int(pos[0]), int(fid[0]), int(foff[0])), int(idx[-1]),
                   gid, out)


def continuity_rules(idx: np.ndarray, term: np.ndarray, pos: np.ndarray, size: np.ndarray,
                     seg: int) -> list[tuple[str, str, np.ndarray, Callable[[int], str]]]:
    """The rules between consecutive entries of one replica's log (arrays in position
    order; both engines): each index is one more than the one before (``index_gap``,
    ``index_repeated``), terms never decrease, and each entry stands where the
    placement rule puts it after the one before. Per rule: (check, kind, a mask
    that is true at ``j`` when entry ``j + 1`` breaks it, its detail for ``j``)."""
    step = np.diff(idx)
    expect = place(pos[:-1] + size[:-1], size[1:], seg)
    return [
        ("lost_offsets", "index_gap", step > 1,
         lambda j: f"index {idx[j]} is followed by {idx[j + 1]}"),
        ("duplicates", "index_repeated", step < 1,
         lambda j: f"index {idx[j]} is followed by {idx[j + 1]}"),
        ("lost_offsets", "term_decrease", np.diff(term) < 0,
         lambda j: f"term {term[j]} at index {idx[j]} is followed by term {term[j + 1]}"),
        ("lost_offsets", "position_gap", pos[1:] != expect,
         lambda j: f"entry at {pos[j + 1]} should be at {expect[j]} by the placement rule"),
    ]


def replica_bounds(meta: ReplicaMeta, first: tuple[int, int, int, int] | None,
                   last: int | None, gid: int, out: Findings) -> None:
    """Where one replica's log starts and ends, against its checkpoint and hardstate.

    ``first`` is (index, position, file id, file offset) of the first entry the
    audit read, ``last`` the last one's index (None, None: it read none). The
    start is judged on the log on disk (``ReplicaMeta.disk_first`` when a window
    skipped it): a log starting where its checkpoint says after index 1 was cut
    by retention (``retention_cut``); a window's view of it is compared from its
    own first entry (``trimmed``). Both engines call this.
    """
    rid = meta.rid
    cp = meta.checkpoint
    disk = meta.disk_first or (first[:3] if first is not None else None)
    if disk is None:  # nothing on disk at all
        if cp and cp.durable_index > 0:
            out.add("lost_offsets", "durable_entries_missing", VIOLATION, gid=gid, rid=rid,
                    index=1, count=cp.durable_index,
                    detail=f"log is empty but the checkpoint says {cp.durable_index} are durable")
        return
    d_idx, d_pos, d_fid = disk
    meta.start_index, meta.start_position = d_idx, d_pos
    meta.retention_cut = bool(cp is not None and d_idx > 1 and d_idx == cp.first_index)
    meta.claimed_start = d_pos
    if cp is not None and cp.first_index and d_idx != cp.first_index:
        if _retention_interrupted(meta, d_idx, d_pos, cp.first_index):
            # Retention deletes the segments, then rewrites the checkpoint: a
            # stop in between leaves this, and recovery adopts the log's start.
            meta.retention_cut = True
            out.add("lost_offsets", "retention_checkpoint_behind", INFO, gid=gid, rid=rid,
                    fid=d_fid, index=d_idx, phys_offset=d_pos,
                    detail=f"first entry is {d_idx} at the start of segment {d_pos}, "
                           f"checkpoint first_index {cp.first_index}: whole segments below "
                           "were removed (a snapshot covers them) and the checkpoint was "
                           "not rewritten yet")
        else:
            if cp.first_index <= 1:
                meta.claimed_start = 0
            out.add("lost_offsets", "log_start_mismatch", VIOLATION, gid=gid, rid=rid,
                    fid=d_fid, index=d_idx,
                    detail=f"first entry is {d_idx}, checkpoint first_index {cp.first_index}")
    # A window's view is compared from its first entry, as a log retention cut.
    meta.trimmed = meta.retention_cut or bool(meta.window_lo and first is not None)
    if meta.window_lo and first is not None and first[0] > meta.window_lo:
        out.add("lost_offsets", "index_gap", VIOLATION, gid=gid, rid=rid, fid=first[2],
                file_offset=first[3], index=first[0], phys_offset=first[1],
                detail=f"the audited window starts at index {meta.window_lo}, this replica "
                       f"holds earlier entries and its next one is {first[0]}")
    if last is None:
        if meta.view_empty != "below":
            return  # the log lies past the window: it ends after it
        # The log ends before the window (the entries before it were verified).
        end, where = meta.window_lo - 1, f"before the window's first index {meta.window_lo}"
    else:
        end, where = last, f"at {last}"
    if cp is not None and end < cp.durable_index:
        out.add("lost_offsets", "durable_entries_missing", VIOLATION, gid=gid, rid=rid,
                index=end + 1, count=cp.durable_index - end,
                detail=f"log ends {where} but the checkpoint says "
                       f"{cp.durable_index} is durable")
    hs = meta.hardstate
    if hs is not None and end < hs.commit:
        out.add("lost_offsets", "committed_entries_missing", VIOLATION, gid=gid, rid=rid,
                index=end + 1, count=hs.commit - end,
                detail=f"log ends {where} but its hardstate commit is {hs.commit}")


def _retention_interrupted(meta: ReplicaMeta, first: int, position: int, cp_first: int
                           ) -> bool:
    """Whether a log starting after its checkpoint's first_index is what an
    interrupted retention leaves: the first entry starts a segment file (whole
    segments went) and a snapshot whose meta decodes covers everything before it."""
    return (first > cp_first and position in meta.segment_starts
            and any(s.index >= first - 1 for s in meta.valid_snapshots()))


Version = tuple[int, int, int, int]  # term, position, size, body_crc: what replicas vote on
EntryAt = tuple[int, int, int, int, int, int]  # fid, file_offset, term, position, size, body_crc


def check_group(entries: pa.Table, state: GroupState, max_examples: int = 20,
                segment_size: int = 0) -> pa.Table:
    """Log-level checks of one group: per-replica continuity, quorum, divergence.

    Fills ``state`` (committed prefix, per-replica agreement, sources of the
    committed log) and returns the findings. The committed prefix is
    ``min(max hardstate commit, quorum end)`` where the quorum end is the last
    index up to which every index has one (term, position, size, body_crc) held
    by a majority of the group's replicas.

    Replicas need not start at index 1: a replica whose log starts where its
    checkpoint says (``ReplicaMeta.trimmed``: retention or an install removed
    the prefix) is compared from its first entry on, and counts toward the
    majority of an index below that start when the replicas still holding
    the index agree on it. Every index two replicas both hold is compared, so
    the range all of them share (``shared_first``..``shared_last``) is
    compared on every replica; a gap inside a replica's log still ends its
    agreement there.

    ``dgroup.check_group`` derives the same from runs of indexes; both apply
    the rules below (``quorum_rule`` to ``retained_ranges``) to their own data.
    """
    out = Findings()
    gid = state.gid
    majority = len(state.replicas) // 2 + 1
    seg = state.segment_size = group_segment_size(state, segment_size)
    df = entries.to_pandas() if entries.num_rows else pd.DataFrame(
        columns=[f.name for f in entries.schema])
    df = df.sort_values(["rid", "position"], kind="stable")
    by_rid = {rid: g for rid, g in df.groupby("rid", sort=True)}
    for rid, meta in state.replicas.items():
        check_replica_log(by_rid.get(rid, df.iloc[:0]), meta, gid, seg, out, max_examples)

    key = ["index", "term", "position", "size", "body_crc"]
    for flag in ("refuted", "confirmed"):  # body verdicts (``bodies``), when a history has them
        if flag not in df.columns:
            df[flag] = False
    if "crc_ok" not in df.columns:
        df["crc_ok"] = True
    votes = df.drop_duplicates(["rid", "index"]).groupby(key, sort=False).agg(
        votes=("rid", "size"), refuted=("refuted", "any"), confirmed=("confirmed", "any"),
        intact=("crc_ok", "any"))
    votes = votes.reset_index()
    # A version the history refutes never wins an index while another exists.
    best = votes.sort_values(["index", "refuted", "votes"], ascending=[True, True, False],
                             kind="stable").drop_duplicates("index")
    open_versions = votes[~votes["refuted"]].groupby("index").size()
    limits = np.array([t for t in (m.vouched_through() for m in state.replicas.values()) if t],
                      np.int64)
    held_mask, short_mask = quorum_rule(
        best["votes"].to_numpy(), best["index"].map(votes.groupby("index").size()).to_numpy(),
        best["index"].map(open_versions).fillna(0).to_numpy(), best["confirmed"].to_numpy(bool),
        best["refuted"].to_numpy(bool), best["intact"].to_numpy(bool),
        retained.vouched_counts(limits, best["index"].to_numpy()), majority)
    held = best[held_mask]
    # An index a majority vouches for was committed even where no replica holds
    # it any more: the committed run goes on across it (``retained.bridge``).
    through = retained.majority_vouched(limits, majority)
    quorum_end, spanned = retained.bridge(held["index"].to_numpy(), through)
    if not len(held) and state.window_lo:
        quorum_end = state.window_lo - 1  # the entries before the window were verified
    first = int(held["index"].iloc[0]) if len(held) else 0
    # Every index some replica holds, in order, with its winning version.
    anywhere = best["index"].to_numpy()
    ref = best.set_index("index")[["term", "position", "size", "body_crc"]]

    def present(lo: int, hi: int) -> int:
        return int(np.searchsorted(anywhere, hi, "right") - np.searchsorted(anywhere, lo))

    def votes_at(index: int) -> int:
        have = best.loc[best["index"] == index, "votes"]
        return int(have.iloc[0]) if len(have) else 0

    def place_of(index: int) -> tuple[int, int] | None:
        if index not in ref.index:
            return None
        return int(ref.at[index, "position"]), int(ref.at[index, "size"])

    committed_prefix(out, state, first, quorum_end, votes_at, present)
    short = best[short_mask & (best["index"] <= state.claimed_commit).to_numpy()]
    under_replicated_as_sent(out, state, int(short["index"].iloc[0]) if len(short) else 0,
                             len(short), int(short["votes"].iloc[0]) if len(short) else 0)
    c = state.committed
    runs: dict[int, list[tuple[int, int]]] = {}
    for rid, meta in state.replicas.items():
        e = by_rid.get(rid, df.iloc[:0]).drop_duplicates("index")
        mine = e.set_index("index")[["term", "position", "size", "body_crc"]]
        common = mine.index.intersection(ref.index)
        diff = (mine.loc[common] != ref.loc[common]).any(axis=1)
        bad = np.sort(common[diff.to_numpy()].to_numpy())
        inside = bad[bad <= c]
        beyond = bad[bad > c]
        report_divergence(out, gid, meta, c, (int(inside[0]) if len(inside) else 0, len(inside)),
                          (int(beyond[0]) if len(beyond) else 0, len(beyond)),
                          functools.partial(_frame_versions, e, ref))
        start = agreement_start(meta, first)
        agree = mine.index.to_numpy()
        agree = agree[(agree >= start) & ~np.isin(agree, bad)]
        brk = np.nonzero(np.diff(agree) != 1)[0]
        # Every agreeing run, to read committed entries that only this replica
        # still holds after a gap retention explains (``committed_sources``).
        runs[rid] = list(zip(np.concatenate([agree[:1], agree[brk + 1]]).tolist(),
                             np.concatenate([agree[brk], agree[-1:]]).tolist(), strict=True))
        agreement_end(out, gid, meta, runs[rid], c)
    state.sources = committed_sources(runs, first, c, through)
    state.retained_away = retained_away(out, state, spanned, max_examples, place_of, present)
    retained_ranges(state)
    return out.table()


def _frame_versions(e: pd.DataFrame, ref: pd.DataFrame, index: int) -> tuple[EntryAt, Version]:
    """A replica's entry at ``index`` (``e``: its entries) and the group's version there."""
    row = e[e["index"] == index].iloc[0]
    r = ref.loc[index]
    return ((int(row["fid"]), int(row["file_offset"]), int(row["term"]), int(row["position"]),
             int(row["size"]), int(row["body_crc"])),
            (int(r["term"]), int(r["position"]), int(r["size"]), int(r["body_crc"])))


# The rules of a group's log checks, which both engines apply: ``check_group`` above
# over every entry row, ``dgroup.check_group`` over runs of indexes.


def group_segment_size(state: GroupState, configured: int = 0) -> int:
    """The group's segment size: ``configured`` (``--segment-size``, checked
    against the files by ``prepare``), else inferred from every replica's
    segment file names (``infer_segment_size``)."""
    return configured or infer_segment_size(
        sorted({s for m in state.replicas.values() for s in m.segment_starts}))


def quorum_rule(votes: np.ndarray, versions: np.ndarray, open_versions: np.ndarray,
                confirmed: np.ndarray, refuted: np.ndarray, intact: np.ndarray,
                vouching: np.ndarray, majority: int) -> tuple[np.ndarray, np.ndarray]:
    """Which indexes the quorum holds, from each index's winning version.

    Per index: ``votes`` (replicas holding the winner), ``versions`` (distinct
    versions of the index), ``open_versions`` (of them, those the history does
    not refute), the history's verdicts on the winner (``confirmed``,
    ``refuted``: ``bodies``), ``intact`` (some copy passes its body CRC) and
    ``vouching`` (replicas whose retention vouches for the index, ``retained``).

    An index is held when a majority votes for its winner. Also when the winner
    is the only version the history does not refute and the history confirms
    it: the others hold bodies nobody sent (not from a damaged copy, which is
    not the entry as sent). And with retention: a replica whose log was cut
    past an index, with a snapshot covering it, held that index once and it
    was committed; it counts toward the index's majority when the replicas
    still holding it agree on one intact version (or the history confirms the
    only version it does not refute), which it must have held too. Inside the
    range every replica keeps, nothing changes.

    Returns (held, short): ``short`` marks indexes held only on the history's
    word by fewer than a majority, counting the vouching replicas
    (``under_replicated_as_sent``).
    """
    alone = open_versions == 1
    vouched = (votes < majority) & confirmed & ~refuted & alone & intact
    one_version = (versions == 1) | (alone & confirmed)
    kept = one_version & ~refuted & intact & (vouching > 0) & (votes + vouching >= majority)
    held = (votes >= majority) | vouched | kept
    return held, vouched & (votes + vouching < majority)


def committed_prefix(out: Findings, state: GroupState, first: int, quorum_end: int,
                     votes_at: Callable[[int], int], present: Callable[[int, int], int]
                     ) -> None:
    """The committed prefix, ``min(max hardstate commit, quorum end)``, into ``state``.

    ``first`` and ``quorum_end`` are the first and last index of the run the
    quorum holds (``quorum_rule``, across the gaps ``retained.bridge`` spans).
    No readable hardstate leaves no committed prefix (info); a hardstate
    commit past the quorum end is ``under_replicated``: indexes said committed
    that no majority holds. ``votes_at(index)`` gives the votes of an index's
    winning version (0: held nowhere), ``present(lo, hi)`` how many indexes of
    ``lo..hi`` some replica holds.
    """
    gid, n = state.gid, len(state.replicas)
    state.first_index = first
    state.quorum_end = quorum_end
    claims = [m.hardstate.commit for m in state.replicas.values() if m.hardstate]
    state.claimed_commit = max(claims) if claims else 0
    state.committed = min(state.claimed_commit, quorum_end)
    if not claims:
        out.add("divergence", "no_hardstate", INFO, gid=gid,
                detail="no replica has a readable hardstate: no committed prefix to check")
    if state.claimed_commit > quorum_end:
        lo = quorum_end + 1
        short = present(lo, state.claimed_commit)
        out.add("lost_offsets", "under_replicated", VIOLATION, gid=gid, index=lo,
                count=state.claimed_commit - quorum_end,
                detail=f"hardstate commit {state.claimed_commit} but index {lo} is held "
                       f"identically by {votes_at(lo)} of {n} replicas "
                       f"(majority {n // 2 + 1}); {short} of the claimed indexes are "
                       "present anywhere")


def under_replicated_as_sent(out: Findings, state: GroupState, first: int, count: int,
                             votes: int) -> None:
    """Committed indexes held as sent by fewer than a majority (``quorum_rule``'s short,
    up to the hardstate commit): ``count`` of them from ``first``, whose winner has
    ``votes``; the other replicas hold bodies the history says were not sent."""
    if not count:
        return
    n = len(state.replicas)
    out.add("lost_offsets", "under_replicated", VIOLATION, gid=state.gid, index=first,
            count=count,
            detail=f"{count} committed indexes from {first} are held as sent by fewer "
                   f"than {n // 2 + 1} of {n} replicas (index {first}: "
                   f"{votes}); the other replicas' versions hold "
                   "bodies the history says were not sent (body_mismatch)")


def report_divergence(out: Findings, gid: int, meta: ReplicaMeta, committed: int,
                      inside: tuple[int, int], beyond: tuple[int, int],
                      versions: Callable[[int], tuple[EntryAt, Version]]) -> None:
    """A replica's indexes whose version is not the group's: within the committed
    prefix a violation (``divergent_entry``, at the first, with both versions),
    beyond it information (Raft may still truncate it). ``inside`` and ``beyond``
    are (first index, count), count 0 for none; ``versions(index)`` gives the
    replica's entry and the group's version there."""
    j, count = inside
    if count:
        (fid, foff, term, pos, size, crc), q = versions(j)
        out.add("divergence", "divergent_entry", VIOLATION, gid=gid, rid=meta.rid,
                fid=fid, file_offset=foff, index=j, phys_offset=pos, count=count,
                detail=f"first divergent index {j}: replica has (term {term}, "
                       f"position {pos}, size {size}, crc "
                       f"{crc:#010x}), quorum has (term {q[0]}, position "
                       f"{q[1]}, size {q[2]}, crc {q[3]:#010x})")
        meta.first_divergent = j
    j, count = beyond
    if count:
        out.add("divergence", "uncommitted_divergence", INFO, gid=gid, rid=meta.rid,
                index=j, count=count,
                detail=f"differs from the majority from index {j}, beyond the "
                       f"committed index {committed} (Raft may still truncate it)")


def agreement_start(meta: ReplicaMeta, first: int) -> int:
    """Where a replica is compared from (``agree_start``): the group's first held index
    ``first``, or where retention (or a window) cut its log (``trimmed``)."""
    meta.agree_start = max(first, meta.first_index) if meta.trimmed and first else first
    return meta.agree_start


def agreement_end(out: Findings, gid: int, meta: ReplicaMeta, runs: list[tuple[int, int]],
                  committed: int) -> None:
    """Where a replica stops agreeing (``agree_end``): the end of its agreeing run from
    ``agree_start`` (``runs``: its agreeing runs from there, in order). One that agrees
    up to its last entry and ends before the committed index is lagging (info)."""
    start = meta.agree_start
    if runs and runs[0][0] == start:
        meta.agree_end = runs[0][1]
    else:
        meta.agree_end = start - 1 if start else 0
    if meta.agree_end < committed and meta.agree_end == meta.last_index:
        out.add("divergence", "lagging_replica", INFO, gid=gid, rid=meta.rid,
                index=meta.agree_end + 1, count=committed - meta.agree_end,
                detail=f"replica ends at {meta.last_index}, committed index is {committed}")


def committed_sources(runs: dict[int, list[tuple[int, int]]], first: int, committed: int,
                      through: int) -> list[tuple[int, int, int]]:
    """Which replica each committed range ``(lo, hi, rid)`` is read from.

    ``runs`` are each replica's agreeing runs. From ``first`` on, the replica
    that agrees the furthest from there (the lowest id on ties); across a gap
    retention explains (up to ``through``, what a majority vouches for), from
    wherever the agreed log resumes: committed entries only one replica still
    holds are read too.
    """
    sources: list[tuple[int, int, int]] = []
    lo = first
    while committed and first and lo <= committed:
        cands = [(b, -rid) for rid, rr in runs.items() for a, b in rr if a <= lo <= b]
        if not cands:
            resume = [a for rr in runs.values() for a, _ in rr if a > lo]
            if lo > through or not resume:
                break
            lo = min(resume)
            continue
        b, neg = max(cands)
        hi = min(b, committed)
        sources.append((lo, hi, -neg))
        lo = hi + 1
    return sources


def retained_away(out: Findings, state: GroupState, spanned: list[tuple[int, int]],
                  max_examples: int, place_of: Callable[[int], tuple[int, int] | None],
                  present: Callable[[int, int], int]) -> list[retained.Gap]:
    """The committed indexes retention removed from every replica (``retained``).

    ``spanned`` are the gaps of the committed run that a majority vouches for;
    the parts no replica should still hold are reported (``retained_away``,
    info) and returned with their positions, which history messages there are
    excused for. A part some replica should still hold is that replica's own
    fault (a lost segment, a damaged entry), reported by its findings.
    ``place_of(index)`` is (position, size) of the group's version of an index
    held anywhere (None: held nowhere), ``present(lo, hi)`` how many indexes of
    ``lo..hi`` some replica holds.
    """
    holds = [span for m in state.replicas.values() if (span := m.should_hold()) is not None]
    reps = sorted(state.replicas.values(), key=lambda m: m.rid)
    ends = [(sf.meta.end_position, sf.meta.index) for m in reps for sf in m.snapshots.values()
            if sf.usable() and sf.meta is not None]
    gaps: list[retained.Gap] = []
    for glo, ghi in spanned:
        for lo, hi in retained.outside_spans(glo, ghi, holds):
            before = place_of(lo - 1)
            pos_lo = before[0] + before[1] if before is not None else 0
            after = place_of(hi + 1)
            if after is not None:
                pos_hi = after[0]
            else:  # where the entry after it starts is unknown: as far as a snapshot says
                pos_hi = max([e for e, i in ends if i <= hi] + [pos_lo])
            who = tuple(m.rid for m in reps if m.vouched_through() >= hi)
            gaps.append(retained.Gap(lo, hi, pos_lo, max(pos_hi, pos_lo), who))
            if len(gaps) > max_examples:
                continue
            names = ", ".join(m.name for m in reps if m.rid in who)
            copies = present(lo, hi)
            # A copy left past a replica's durable point may be torn or damaged:
            # what it holds is not the committed entry.
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


def retained_ranges(state: GroupState) -> None:
    """The group's retained ranges, from its replicas' logs (``retained_first``,
    ``retained_from``: below that position retention removed the log everywhere)
    and the range every replica holding entries shares (``shared_first``..)."""
    holding = [m for m in state.replicas.values() if m.entries]
    if holding:
        state.retained_first = min(m.first_index for m in holding)
        state.retained_from = min(m.claimed_start for m in holding)
        lo, hi = max(m.first_index for m in holding), min(m.last_index for m in holding)
        if lo <= hi:
            state.shared_first, state.shared_last = lo, hi


def check_index_files(index: pa.Table, entries: pa.Table, gid: int, rid: int,
                      max_examples: int = 20) -> pa.Table:
    """Raft-index records against the entries of the same replica.

    Index files are derived data that recovery rebuilds, so a record that is
    missing, fails its CRC or lies beyond the log is reported as ``info``;
    a well-formed (CRC-valid) record that disagrees with its entry is a
    violation, because no torn write produces a valid CRC over wrong data.
    """
    out = Findings()
    ix = index.to_pandas().drop_duplicates("index", keep="last").set_index("index")
    en = entries.to_pandas().drop_duplicates("index").set_index("index")
    bad_crc = ix[~ix["rec_ok"]]
    if len(bad_crc):
        j = int(bad_crc.index[0])
        out.add("index_validity", "raft_index_record_crc", INFO, gid=gid, rid=rid,
                fid=int(bad_crc["fid"].iloc[0]), index=j, count=len(bad_crc),
                detail=f"{len(bad_crc)} index records fail their CRC, first at index {j}")
    good = ix[ix["rec_ok"]]
    common = good.index.intersection(en.index)
    cols = ["position", "term", "size", "kind", "body_crc"]
    a = good.loc[common, cols]
    b = en.loc[common, cols]
    wrong = common[(a.to_numpy() != b.to_numpy()).any(axis=1)]
    for j in wrong[:max_examples]:
        out.add("index_validity", "raft_index_mismatch", VIOLATION, gid=gid, rid=rid,
                fid=int(good.at[j, "fid"]), index=int(j), phys_offset=int(en.at[j, "position"]),
                detail=f"index record {a.loc[j].to_dict()} != entry {b.loc[j].to_dict()}")
    if len(wrong) > max_examples:
        out.add("index_validity", "raft_index_mismatch", VIOLATION, gid=gid, rid=rid,
                count=len(wrong) - max_examples, detail="further occurrences not listed")
    missing = en.index.difference(ix.index)
    if len(missing):
        out.add("index_validity", "raft_index_missing", INFO, gid=gid, rid=rid,
                index=int(missing[0]), count=len(missing),
                detail=f"{len(missing)} entries have no index record (rebuilt at recovery)")
    extra = good.index.difference(en.index)
    if len(en):
        # Records below the first entry are what retention leaves in the index
        # file it keeps (files go whole); they name nothing on disk any more.
        extra = extra[extra > en.index.min()]
    if len(extra):
        out.add("index_validity", "raft_index_beyond_log", INFO, gid=gid, rid=rid,
                index=int(extra[0]), count=len(extra),
                detail=f"{len(extra)} index records name entries not in the log")
    return out.table()


def problem_findings(problems: pa.Table, starts: dict[int, int], kinds: dict[int, str],
                     durable_end: dict[tuple[int, int], int]) -> pa.Table:
    """Turn parse problems into corruption findings.

    A torn tail after the replica's ``durable_end`` is what a crash leaves and
    recovery cuts: ``info``. At or before it, acknowledged-durable data is gone:
    a violation.
    """
    out = Findings()
    for p in problems.to_pylist():
        kind = p["problem"]
        fid = p["fid"]
        pos = starts.get(fid, 0) + p["file_offset"] if kinds.get(fid) == "segment" else -1
        sev = VIOLATION
        detail = p["detail"]
        # An implausible value passed its CRCs: a rewrite, never what a crash leaves.
        if kinds.get(fid) == "segment" and kind != "implausible_value" and pos >= durable_end.get(
                (p["gid"], p["rid"]), 0):
            # Past the durable point: what a crash leaves and recovery cuts.
            sev, detail = INFO, f"{kind}: {detail}"
            kind = "torn_tail"
        out.add("corruption", kind, sev, gid=p["gid"], rid=p["rid"], fid=fid,
                file_offset=p["file_offset"], index=p["index"], phys_offset=pos,
                detail=detail)
    return out.table()


# ------------------------------------------------------------------ message level


@dataclass
class QueueBounds:
    """What the queue check needs to know about one replica of a group."""

    committed: int  # the group's committed index
    must_index: int  # last index whose messages must be in this replica's ConsumeQueues
    # First log position still on disk (or the window's): units below it point at
    # messages retention removed (a queue file goes only when every unit of it does).
    log_start: int
    # Where a cut stops the view (-1: none): units past it were not read.
    log_end: int = -1


def queue_bounds(st: GroupState, m: ReplicaMeta) -> QueueBounds:
    """One replica's ``QueueBounds`` after the log checks of its group (both engines)."""
    must = min(st.committed, m.agree_end)
    if m.dispatch is not None:
        must = min(must, m.dispatch.dispatched_index)
    start = m.read_from if m.read_from >= 0 else (
        min(m.segment_starts) if m.segment_starts else 0)
    return QueueBounds(st.committed, must, start, m.read_to)


def check_queue_replica(out: Findings, gid: int, topic: str, queue_id: int, rid: int,
                        msgs: np.ndarray, units: np.ndarray, unit_fid: np.ndarray,
                        msg_fid: Callable[[np.ndarray], np.ndarray], bounds: QueueBounds,
                        max_examples: int = 20) -> None:
    """One replica's units of one (topic, queue) against its messages of that queue.

    ``msgs`` (``parse.MSG_DTYPE``) are in log order, ``units``
    (``parse.UNIT_DTYPE``) in slot order with the file id of each in
    ``unit_fid``; ``msg_fid(phys_offsets)`` gives the segment file ids of
    messages (only called for reported examples). Units must point at real
    messages of this queue with the right size and tag hash, offsets increase
    with the slot, no hole, no message indexed twice, and every message that
    must be dispatched is indexed.
    """
    kw = QueueAt(gid=gid, topic=topic, queue_id=queue_id, rid=rid)

    def emit(check: str, kind: str, sel: np.ndarray, fid: np.ndarray, slot: np.ndarray,
             off: np.ndarray, idx: np.ndarray, text: Callable[[int], str]) -> None:
        for j in sel[:max_examples]:
            out.add(check, kind, VIOLATION, fid=int(fid[j]), slot=int(slot[j]),
                    phys_offset=int(off[j]), index=int(idx[j]), detail=text(j), **kw)
        if len(sel) > max_examples:
            out.add(check, kind, VIOLATION, count=len(sel) - max_examples,
                    detail="further occurrences not listed", **kw)

    m_off = msgs["phys_offset"]
    if len(units):
        slots = units["slot"]
        offs = units["offset"]
        none = np.full(len(units), -1, np.int64)
        gaps = np.nonzero(np.diff(slots) > 1)[0] + 1
        emit("lost_offsets", "cq_hole", gaps, unit_fid, slots, offs, none,
             lambda j: f"empty slot(s) before slot {slots[j]} after a non-empty slot")
        back = np.nonzero(np.diff(offs) <= 0)[0] + 1
        emit("index_validity", "cq_out_of_order", back, unit_fid, slots, offs, none,
             lambda j: f"slot {slots[j]} offset {offs[j]} does not increase")
        # Later units (in slot order) repeating an earlier unit's offset; none
        # when offsets strictly increase (the usual case, no sort needed).
        again = np.zeros(len(offs), bool)
        if len(back):
            order = np.argsort(offs, kind="stable")
            again[order[1:][offs[order][1:] == offs[order][:-1]]] = True
        emit("duplicates", "indexed_twice", np.nonzero(again)[0], unit_fid, slots, offs, none,
             lambda j: f"message at {offs[j]} is indexed again at slot {slots[j]}")
        at = _positions(m_off, offs)
        at_c = np.minimum(at, max(len(m_off) - 1, 0))
        found = (at < len(m_off)) & (m_off[at_c] == offs) if len(m_off) else np.zeros(
            len(offs), bool)
        m_idx = np.where(found, msgs["index"][at_c] if len(m_off) else none, -1)
        dangling = np.nonzero(~found & (offs >= bounds.log_start))[0]
        emit("index_validity", "cq_dangling", dangling, unit_fid, slots, offs, none,
             lambda j: f"slot {slots[j]} points at {offs[j]}, where no message of "
                       f"{topic}/{queue_id} starts")
        if len(m_off):
            m_size = msgs["size"][at_c]
            m_tag = msgs["tag_hash"][at_c]
            size_bad = np.nonzero(found & (units["size"] != m_size))[0]
            emit("index_validity", "cq_size_mismatch", size_bad, unit_fid, slots, offs, m_idx,
                 lambda j: f"slot {slots[j]} size {units['size'][j]}, message is {m_size[j]}")
            tag_bad = np.nonzero(found & (units["tag_hash"] != m_tag))[0]
            emit("index_validity", "cq_tag_mismatch", tag_bad, unit_fid, slots, offs, m_idx,
                 lambda j: f"slot {slots[j]} tag hash {units['tag_hash'][j]:#x}, message has "
                           f"{m_tag[j]:#x}")
            late = np.nonzero(found & (m_idx > bounds.committed))[0]
            if len(late):
                j = late[0]
                beyond_commit(out, kw, len(late), int(slots[j]), int(offs[j]), int(m_idx[j]),
                              bounds.committed)
    need = np.nonzero(msgs["index"] <= bounds.must_index)[0]
    if len(need):
        if len(units) >= len(need) and need[-1] == len(need) - 1 and np.array_equal(
                units["offset"][:len(need)], m_off[:len(need)]):
            indexed = np.ones(len(need), bool)  # the usual case: units are the messages
        elif len(units):
            indexed = _member(m_off[need], units["offset"])
        else:
            indexed = np.zeros(len(need), bool)
        miss = need[~indexed]
        if len(miss):
            shown = miss[:max_examples]
            fid = np.full(len(m_off), -1, np.int64)
            fid[shown] = msg_fid(m_off[shown])
            emit("index_validity", "cq_not_indexed", miss, fid, np.full(len(m_off), -1),
                 m_off, msgs["index"],
                 lambda j: f"committed message at {m_off[j]} (entry {msgs['index'][j]}) has no "
                           f"unit in {topic}/{queue_id}")


def beyond_commit(out: Findings, at: QueueAt, count: int, slot: int, offset: int, index: int,
                  committed: int) -> None:
    """``cq_beyond_commit`` (info): ``count`` units of one replica's queue point at entries
    past the group's known committed index (a hardstate's commit is written lazily), the
    first at ``slot`` (message at ``offset``, entry ``index``)."""
    out.add("index_validity", "cq_beyond_commit", INFO, slot=slot, phys_offset=offset,
            index=index, count=count,
            detail=f"{count} units point at entries beyond the known "
                   f"committed index {committed} (hardstate commit is lazy)", **at)


def _positions(sorted_values: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """``np.searchsorted``, skipped for the leading needles equal to the values.

    Healthy queues index their messages one to one, so usually every needle
    is found at its own position and no search is needed.
    """
    k = min(len(sorted_values), len(needles))
    if k and np.array_equal(sorted_values[:k], needles[:k]):
        return np.concatenate([np.arange(k), np.searchsorted(sorted_values, needles[k:])])
    return np.searchsorted(sorted_values, needles)


def _member(values: np.ndarray, sorted_or_not: np.ndarray) -> np.ndarray:
    """``np.isin`` for int64 arrays, by binary search (no sort when already sorted)."""
    ref = sorted_or_not
    if len(ref) > 1 and not (ref[1:] > ref[:-1]).all():
        ref = np.unique(ref)
    at = np.minimum(np.searchsorted(ref, values), len(ref) - 1)
    found: np.ndarray = ref[at] == values
    return found


def slot_conflicts(out: Findings, gid: int, topic: str, queue_id: int,
                   views: list[tuple[int, np.ndarray]], max_examples: int = 20) -> None:
    """The same slot of one queue pointing at different offsets on different replicas.

    ``views`` holds (rid, units) for every replica that has units of the queue.
    """
    if len(views) < 2:
        return
    slot = np.concatenate([u["slot"] for _, u in views])
    off = np.concatenate([u["offset"] for _, u in views])
    rid = np.concatenate([np.full(len(u), r) for r, u in views])
    order = np.lexsort((off, slot))
    s, o = slot[order], off[order]
    differs = (s[1:] == s[:-1]) & (o[1:] != o[:-1])
    clash = np.unique(s[1:][differs])
    kw = QueueAt(gid=gid, topic=topic, queue_id=queue_id)
    for c in clash[:max_examples]:
        at = np.nonzero(slot == c)[0]
        out.add("duplicates", "cq_slot_conflict", VIOLATION, slot=int(c), count=1,
                detail="slot points at different offsets on replicas: " + ", ".join(
                    f"rid {rid[j]}->{off[j]}" for j in at), **kw)
    if len(clash) > max_examples:
        out.add("duplicates", "cq_slot_conflict", VIOLATION, count=len(clash) - max_examples,
                detail="further occurrences not listed", **kw)


def find_duplicate_ids(out: Findings, gid: int, msgs: np.ndarray, max_examples: int = 20
                       ) -> None:
    """The same client identity (producer_id, sequence) at more than one offset.

    ``msgs`` (``parse.MSG_DTYPE``) are the committed messages of one group in
    log order;
    producer id 0 means "no identity". One finding per duplicated identity,
    identities in (producer id, sequence) order, the first ``max_examples``
    with the offsets.
    """
    m = msgs[msgs["producer_id"] != 0]
    if len(m) < 2:
        return
    pid, seq = m["producer_id"], m["sequence"]
    # Usually each producer's sequences increase along the log: then there is
    # no duplicate, which a radix sort by (few) producers shows without
    # sorting the identities.
    codes, uniq = pd.factorize(pid)
    if len(uniq) < 1 << 15:
        by_pid = np.argsort(codes.astype(np.int16), kind="stable")
        c, q = codes[by_pid], seq[by_pid]
        if ((c[1:] != c[:-1]) | (q[1:] > q[:-1])).all():
            return
    for shown, rows in enumerate(identity_runs(pid, seq)):
        duplicate_id(out, gid, shown < max_examples, int(pid[rows[0]]), int(seq[rows[0]]),
                     int(m["index"][rows[1]]), len(rows) - 1, m["phys_offset"][rows].tolist())


def identity_runs(pid: np.ndarray, seq: np.ndarray) -> list[np.ndarray]:
    """The rows of every client identity (``pid``, ``seq``, given in log order) stored
    more than once: per identity, in (producer id, sequence) order, its rows in log
    order (both engines)."""
    # lexsort is stable: equal identities stay in log order (ascending offsets).
    order = np.lexsort((seq, pid))
    ps, ss = pid[order], seq[order]
    same = (ps[1:] == ps[:-1]) & (ss[1:] == ss[:-1])
    if not same.any():
        return []
    # Runs of equal identities: a run starts where ``same`` turns on.
    edge = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
    starts = np.nonzero(edge == 1)[0]
    ends = np.nonzero(edge == -1)[0]  # last row of each run
    return [order[a:b + 1] for a, b in zip(starts, ends, strict=True)]


def duplicate_id(out: Findings, gid: int, listed: bool, producer: int, sequence: int,
                 index: int, count: int, offsets: list[int]) -> None:
    """``duplicate_client_id``: one client identity stored ``count`` times more than once,
    at ``offsets`` in log order (``index``: the entry of the second). Past the examples
    (not ``listed``) only the count is given."""
    if not listed:
        out.add("duplicates", "duplicate_client_id", VIOLATION, gid=gid, count=count,
                detail="further occurrences not listed")
        return
    out.add("duplicates", "duplicate_client_id", VIOLATION, gid=gid, index=index,
            phys_offset=offsets[1], count=count,
            detail=f"producer {producer & 0xFFFFFFFFFFFFFFFF:#x} sequence {sequence} "
                   "stored at " + ", ".join(str(x) for x in offsets))


def _pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two int64 columns as one 16-byte value per row (for set operations)."""
    return np.ascontiguousarray(np.stack([a, b], axis=1)).view("V16")[:, 0]


def lookup_keys(gid: int, msgs: np.ndarray, keys: pa.Table) -> pa.Table:
    """Committed messages of group ``gid`` named by history keys.

    A key names a message by (producer_id, sequence) when its producer id is
    non-zero, else by physical offset. Returns distinct (gid, producer_id,
    sequence, phys_offset) rows.
    """
    cols = ["gid", "producer_id", "sequence", "phys_offset"]
    k = keys.filter(pc.equal(keys.column("gid"), gid))
    kp = k.column("producer_id").to_numpy()
    ks = k.column("sequence").to_numpy()
    ko = k.column("phys_offset").to_numpy()
    by_id = np.zeros(len(msgs), bool)
    if (kp != 0).any():
        by_id = (msgs["producer_id"] != 0) & np.isin(
            _pairs(msgs["producer_id"], msgs["sequence"]), _pairs(kp[kp != 0], ks[kp != 0]))
    by_off = np.isin(msgs["phys_offset"], ko[ko >= 0])
    hit = msgs[by_id | by_off]
    return pa.table({"gid": pa.array(np.full(len(hit), gid, np.int32)),
                     "producer_id": pa.array(hit["producer_id"]),
                     "sequence": pa.array(hit["sequence"]),
                     "phys_offset": pa.array(hit["phys_offset"])}).select(cols)
