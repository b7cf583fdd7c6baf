"""A replica's snapshot files, against their own bytes and against the log.

The broker writes a snapshot of its state at an applied Raft index as
``snapshots/<index:020d>/{state,meta}``; retention then removes the log below
it, so from then on the snapshot is the only record of what those entries
did. The audit decodes each ``meta`` with its own parser
(``fmt.parse_snapshot_meta``; an undecodable one is ``bad_snapshot_meta``,
reported where the small files are read), takes each ``state`` file's length
and CRC from a ``crc`` file task, and checks here:

- ``snapshot_unfinished`` (info): a state without its meta: the broker writes
  the state first and the meta last, so this is a write cut short, not a
  snapshot; ``snapshot_state_missing``: a meta without its state;
- ``snapshot_misnamed``: the meta's index is not its directory's;
- ``snapshot_state_size``, ``snapshot_state_crc``: the state file is not the
  one the meta describes;
- ``snapshot_log_mismatch``: the snapshot's (term, end position) are not
  those of entry ``index`` in the replica's log, or, when the replica no
  longer holds it, in the log of a replica that agrees with the group there;
- ``snapshot_beyond_log``: the snapshot covers entries the replica's log does
  not reach (it applied entries its log lost);
- ``prefix_not_in_snapshot``: the log starts at F > 1 (retention removed the
  entries before it) but no usable snapshot covers F - 1: the effect of the
  removed entries is nowhere on the replica.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit import fmt
from spark_audit.checks import INFO, VIOLATION, Findings, GroupState, ReplicaMeta, SnapshotFiles


class _At(TypedDict):
    """Whose snapshot a finding is about (keyword arguments of ``Findings.add``)."""

    gid: int
    rid: int
    index: int


def usable(snap: SnapshotFiles) -> bool:
    """The snapshot can restore a state: meta decoded, named right, state verified."""
    return snap.usable()


def newest_usable(meta: ReplicaMeta) -> fmt.SnapshotMeta | None:
    """The newest usable snapshot of a replica (what its broker would restore)."""
    return meta.newest_usable()


def check_snapshots(entries: pa.Table, st: GroupState) -> pa.Table:
    """Every replica's snapshots of one group (``entries`` as ``check_group`` reads them).

    Run after ``checks.check_group``, which fills each replica's retained
    range and agreement range.
    """
    out = Findings()
    want = sorted({s.meta.index for m in st.replicas.values() for s in m.snapshots.values()
                   if s.meta is not None})
    rows = entries.filter(pc.is_in(entries.column("index"), pa.array(want, pa.int64())))
    found = rows.select(["rid", "index", "term", "position", "size"]).to_pandas()
    for rid, m in st.replicas.items():
        for snap in (s for _, s in sorted(m.snapshots.items())):
            _files(out, st.gid, rid, snap)
            if snap.meta is not None:
                _against_log(out, st, m, snap.meta, snap.meta_fid, found)
        if m.retention_cut:
            best = newest_usable(m)
            first = m.start_index
            if best is None or best.index < first - 1:
                have = f"the newest usable snapshot is at {best.index}" if best else (
                    "it has no usable snapshot")
                out.add("lost_offsets", "prefix_not_in_snapshot", VIOLATION, gid=st.gid,
                        rid=rid, index=first, phys_offset=m.start_position,
                        detail=f"the log starts at {first} (retention removed what was "
                               f"before) but {have}: the state of entries before "
                               f"{first} is on no file of this replica")
    return out.table()


def _files(out: Findings, gid: int, rid: int, snap: SnapshotFiles) -> None:
    """One snapshot directory's files against each other."""
    kw = _At(gid=gid, rid=rid, index=snap.index)
    if snap.meta_fid < 0:
        # The state is written first, the meta last: no meta, no snapshot yet.
        out.add("corruption", "snapshot_unfinished", INFO, fid=snap.state_fid,
                detail=f"snapshot {snap.index} has a state but no meta: a snapshot write cut "
                       "short (not a snapshot; the broker ignores it)", **kw)
        return
    m = snap.meta
    if m is None:
        return  # undecodable: bad_snapshot_meta where the small files are read
    if snap.state_fid < 0:
        out.add("corruption", "snapshot_state_missing", VIOLATION, fid=snap.meta_fid,
                detail=f"snapshot {snap.index}'s meta vouches for a state of {m.state_bytes} "
                       "bytes, and there is no state file", **kw)
    if m.index != snap.index:
        out.add("corruption", "snapshot_misnamed", VIOLATION, fid=snap.meta_fid,
                detail=f"directory {snap.index:020d} holds the meta of snapshot {m.index}", **kw)
    if snap.state_fid < 0:
        return
    if snap.state_length != m.state_bytes:
        out.add("corruption", "snapshot_state_size", VIOLATION, fid=snap.state_fid,
                detail=f"state is {snap.state_length} bytes, its meta says {m.state_bytes}",
                **kw)
    elif snap.state_crc != m.state_crc:
        out.add("corruption", "snapshot_state_crc", VIOLATION, fid=snap.state_fid,
                detail=f"state CRC {snap.state_crc:#010x}, its meta says {m.state_crc:#010x}",
                **kw)


def _against_log(out: Findings, st: GroupState, m: ReplicaMeta, snap: fmt.SnapshotMeta,
                 fid: int, found: pd.DataFrame) -> None:
    """A snapshot's (index, term, end position) against the entry it names."""
    kw = _At(gid=st.gid, rid=m.rid, index=snap.index)
    # Past a cut (written after it) or, for a view without entries, where the
    # audit cannot see the log's end: not judged against the log.
    if (m.cut and snap.index > m.cut) or m.view_empty == "above" or (
            m.view_empty == "below" and snap.index < m.window_lo):
        return
    at = found[found["index"] == snap.index]
    own = at[at["rid"] == m.rid]
    if m.entries == 0 or snap.index > m.last_index:
        last = m.last_index if m.entries else (
            f"(before {m.window_lo})" if m.view_empty else m.last_index)
        out.add("lost_offsets", "snapshot_beyond_log", VIOLATION, fid=fid,
                detail=f"snapshot {snap.index} (term {snap.term}) covers entries beyond the "
                       f"log's last index {last}", **kw)
        return
    where = "this replica's log"
    if len(own):
        term, end = int(own["term"].iloc[0]), int(own["position"].iloc[0] + own["size"].iloc[0])
    elif snap.index == m.first_index - 1:
        # The entry just before the log: only its end is known. The log starts
        # there, or at the next segment if its first entry did not fit.
        seg, e = st.segment_size, snap.end_position
        if m.first_position != e and not (seg and e < m.first_position == (e // seg + 1) * seg):
            out.add("divergence", "snapshot_log_mismatch", VIOLATION, fid=fid,
                    phys_offset=m.first_position,
                    detail=f"snapshot {snap.index} ends at {snap.end_position}, the log "
                           f"after it starts at {m.first_position}", **kw)
        return
    else:
        agreeing = [r for r, o in st.replicas.items()
                    if o.agree_start <= snap.index <= o.agree_end]
        other = at[np.isin(at["rid"].to_numpy(), agreeing)]
        if not len(other):
            return  # nobody holds that entry any more: nothing to compare with
        term = int(other["term"].iloc[0])
        end = int(other["position"].iloc[0] + other["size"].iloc[0])
        where = "the group's agreed log"
    if (term, end) != (snap.term, snap.end_position):
        out.add("divergence", "snapshot_log_mismatch", VIOLATION, fid=fid, phys_offset=end,
                detail=f"snapshot {snap.index} has term {snap.term} and ends at "
                       f"{snap.end_position}; entry {snap.index} of {where} has term {term} "
                       f"and ends at {end}", **kw)
