"""The audit's checks, as plain functions over Arrow tables.

Six checks, each producing rows of ``FINDING_SCHEMA``:

- ``corruption``: CRC, magic, size and record-layout failures, with file and offset.
- ``lost_offsets``: Raft index / position / term anomalies along one replica's
  log, durable or committed entries missing, under-replicated committed
  entries, ConsumeQueue holes, acknowledged sends not in the log.
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

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit import fmt

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

# Parse problems and the check they belong to; anything else is corruption.
PROBLEM_CHECK = {"torn_tail": "corruption"}


class Findings:
    """Collects findings; ``count`` lets one row stand for a run of anomalies."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, check: str, kind: str, severity: str, *, gid: int = -1, rid: int = -1,
            fid: int = -1, file_offset: int = -1, index: int = -1, topic: str = "",
            queue_id: int = -1, slot: int = -1, phys_offset: int = -1, count: int = 1,
            detail: str = "") -> None:
        assert check in CHECKS, check
        self.rows.append(dict(check=check, kind=kind, severity=severity, gid=gid, rid=rid,
                              fid=fid, file_offset=file_offset, index=index, topic=topic,
                              queue_id=queue_id, slot=slot, phys_offset=phys_offset,
                              count=count, detail=detail))

    def table(self) -> pa.Table:
        return findings_table(self.rows)


def findings_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return FINDING_SCHEMA.empty_table()
    return pa.Table.from_pylist(rows, schema=FINDING_SCHEMA)


def concat_findings(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else FINDING_SCHEMA.empty_table()


# --------------------------------------------------------------------------- log


@dataclass
class ReplicaMeta:
    """What the small files of one replica say, and what the audit derived."""

    rid: int
    name: str
    checkpoint: fmt.Checkpoint | None = None
    hardstate: fmt.HardState | None = None
    dispatch: fmt.DispatchCheckpoint | None = None
    segment_starts: list[int] = field(default_factory=list)
    # Filled by check_group:
    entries: int = 0
    first_index: int = 0
    last_index: int = 0
    last_term: int = 0
    agree_end: int = 0  # last index up to which this replica matches the quorum
    first_divergent: int = 0  # 0 = none within the committed prefix


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
        cp = meta.checkpoint
        if cp and cp.durable_index > 0:
            out.add("lost_offsets", "durable_entries_missing", VIOLATION, gid=gid, rid=rid,
                    index=1, count=cp.durable_index,
                    detail=f"log is empty but the checkpoint says {cp.durable_index} are durable")
        return
    idx = e["index"].to_numpy()
    term = e["term"].to_numpy()
    pos = e["position"].to_numpy()
    size = e["size"].to_numpy().astype(np.int64)
    fid = e["fid"].to_numpy()
    foff = e["file_offset"].to_numpy()
    meta.first_index, meta.last_index, meta.last_term = int(idx[0]), int(idx[-1]), int(term[-1])

    def report(check: str, kind: str, mask: np.ndarray, text) -> None:
        hits = _examples(mask)
        for j in hits[:max_examples]:
            out.add(check, kind, VIOLATION, gid=gid, rid=rid, fid=int(fid[j + 1]),
                    file_offset=int(foff[j + 1]), index=int(idx[j + 1]),
                    phys_offset=int(pos[j + 1]), detail=text(j))
        if len(hits) > max_examples:
            out.add(check, kind, VIOLATION, gid=gid, rid=rid, index=int(idx[hits[max_examples]]),
                    count=len(hits) - max_examples, detail="further occurrences not listed")

    step = np.diff(idx)
    report("lost_offsets", "index_gap", step > 1,
           lambda j: f"index {idx[j]} is followed by {idx[j + 1]}")
    report("duplicates", "index_repeated", step < 1,
           lambda j: f"index {idx[j]} is followed by {idx[j + 1]}")
    report("lost_offsets", "term_decrease", np.diff(term) < 0,
           lambda j: f"term {term[j]} at index {idx[j]} is followed by term {term[j + 1]}")
    expect = place(pos[:-1] + size[:-1], size[1:], seg)
    report("lost_offsets", "position_gap", pos[1:] != expect,
           lambda j: f"entry at {pos[j + 1]} should be at {expect[j]} by the placement rule")
    cp = meta.checkpoint
    if cp is not None:
        if cp.first_index and idx[0] != cp.first_index:
            out.add("lost_offsets", "log_start_mismatch", VIOLATION, gid=gid, rid=rid,
                    fid=int(fid[0]), index=int(idx[0]),
                    detail=f"first entry is {idx[0]}, checkpoint first_index {cp.first_index}")
        if idx[-1] < cp.durable_index:
            out.add("lost_offsets", "durable_entries_missing", VIOLATION, gid=gid, rid=rid,
                    index=int(idx[-1]) + 1, count=cp.durable_index - int(idx[-1]),
                    detail=f"log ends at {idx[-1]} but the checkpoint says "
                           f"{cp.durable_index} is durable")
    hs = meta.hardstate
    if hs is not None and idx[-1] < hs.commit:
        out.add("lost_offsets", "committed_entries_missing", VIOLATION, gid=gid, rid=rid,
                index=int(idx[-1]) + 1, count=hs.commit - int(idx[-1]),
                detail=f"log ends at {idx[-1]} but its hardstate commit is {hs.commit}")


def check_group(entries: pa.Table, state: GroupState, max_examples: int = 20,
                segment_size: int = 0) -> pa.Table:
    """Log-level checks of one group: per-replica continuity, quorum, divergence.

    Fills ``state`` (committed prefix, per-replica agreement, sources of the
    committed log) and returns the findings. The committed prefix is
    ``min(max hardstate commit, quorum end)`` where the quorum end is the last
    index up to which every index has one (term, position, size, body_crc) held
    by a majority of the group's replicas.
    """
    out = Findings()
    gid = state.gid
    n = len(state.replicas)
    majority = n // 2 + 1
    starts = sorted({s for m in state.replicas.values() for s in m.segment_starts})
    seg = segment_size or infer_segment_size(starts)
    state.segment_size = seg
    df = entries.to_pandas() if entries.num_rows else pd.DataFrame(
        columns=[f.name for f in entries.schema])
    df = df.sort_values(["rid", "position"], kind="stable")
    by_rid = {rid: g for rid, g in df.groupby("rid", sort=True)}
    for rid, meta in state.replicas.items():
        check_replica_log(by_rid.get(rid, df.iloc[:0]), meta, gid, seg, out, max_examples)

    key = ["index", "term", "position", "size", "body_crc"]
    votes = df.drop_duplicates(["rid", "index"]).groupby(key, sort=False).size()
    votes = votes.rename("votes").reset_index()
    best = votes.sort_values(["index", "votes"], ascending=[True, False],
                             kind="stable").drop_duplicates("index")
    held = best[best["votes"] >= majority]
    quorum_end = 0
    first = 0
    if len(held):
        hidx = held["index"].to_numpy()
        first = int(hidx[0])
        breaks = np.nonzero(np.diff(hidx) != 1)[0]
        quorum_end = int(hidx[breaks[0]] if len(breaks) else hidx[-1])
    state.first_index = first
    state.quorum_end = quorum_end
    claims = [m.hardstate.commit for m in state.replicas.values() if m.hardstate]
    state.claimed_commit = max(claims) if claims else 0
    state.committed = min(state.claimed_commit, quorum_end)
    if not claims:
        out.add("divergence", "no_hardstate", INFO, gid=gid,
                detail="no replica has a readable hardstate: no committed prefix to check")
    if state.claimed_commit > quorum_end:
        short = best[(best["index"] > quorum_end) & (best["index"] <= state.claimed_commit)]
        lo = quorum_end + 1
        have = best.loc[best["index"] == lo, "votes"]
        out.add("lost_offsets", "under_replicated", VIOLATION, gid=gid, index=lo,
                count=state.claimed_commit - quorum_end,
                detail=f"hardstate commit {state.claimed_commit} but index {lo} is held "
                       f"identically by {int(have.iloc[0]) if len(have) else 0} of {n} replicas "
                       f"(majority {majority}); {len(short)} of the claimed indexes are "
                       "present anywhere")

    ref = best.set_index("index")[["term", "position", "size", "body_crc"]]
    c = state.committed
    sources: list[tuple[int, int, int]] = []
    for rid, meta in state.replicas.items():
        e = by_rid.get(rid, df.iloc[:0]).drop_duplicates("index")
        mine = e.set_index("index")[["term", "position", "size", "body_crc"]]
        common = mine.index.intersection(ref.index)
        diff = (mine.loc[common] != ref.loc[common]).any(axis=1)
        bad = np.sort(common[diff.to_numpy()].to_numpy())
        inside = bad[bad <= c]
        beyond = bad[bad > c]
        if len(inside):
            j = int(inside[0])
            row = e[e["index"] == j].iloc[0]
            r = ref.loc[j]
            out.add("divergence", "divergent_entry", VIOLATION, gid=gid, rid=rid,
                    fid=int(row["fid"]), file_offset=int(row["file_offset"]), index=j,
                    phys_offset=int(row["position"]), count=len(inside),
                    detail=f"first divergent index {j}: replica has (term {row['term']}, "
                           f"position {row['position']}, size {row['size']}, crc "
                           f"{row['body_crc']:#010x}), quorum has (term {r['term']}, position "
                           f"{r['position']}, size {r['size']}, crc {int(r['body_crc']):#010x})")
            meta.first_divergent = j
        if len(beyond):
            out.add("divergence", "uncommitted_divergence", INFO, gid=gid, rid=rid,
                    index=int(beyond[0]), count=len(beyond),
                    detail=f"differs from the majority from index {beyond[0]}, beyond the "
                           f"committed index {c} (Raft may still truncate it)")
        agree = mine.index.to_numpy()
        agree = agree[(agree >= first) & ~np.isin(agree, bad)]
        # Agreement end: last index of the contiguous agreeing run from the group start.
        if len(agree) and agree[0] == first:
            brk = np.nonzero(np.diff(agree) != 1)[0]
            meta.agree_end = int(agree[brk[0]] if len(brk) else agree[-1])
        else:
            meta.agree_end = first - 1 if first else 0
        if meta.agree_end < c and meta.agree_end == meta.last_index:
            out.add("divergence", "lagging_replica", INFO, gid=gid, rid=rid,
                    index=meta.agree_end + 1, count=c - meta.agree_end,
                    detail=f"replica ends at {meta.last_index}, committed index is {c}")
    # Committed entries are read from the lowest replica id that agrees up to there.
    lo = first
    while c and lo <= c:
        cands = [m for m in state.replicas.values() if m.agree_end >= lo]
        if not cands:
            break
        m = max(cands, key=lambda m: (m.agree_end, -m.rid))
        hi = min(m.agree_end, c)
        sources.append((lo, hi, m.rid))
        lo = hi + 1
    state.sources = sources
    return out.table()


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
        if kinds.get(fid) == "segment" and pos >= durable_end.get((p["gid"], p["rid"]), 0):
            # Past the durable point: what a crash leaves and recovery cuts.
            sev, detail = INFO, f"{kind}: {detail}"
            kind = "torn_tail"
        out.add("corruption", kind, sev, gid=p["gid"], rid=p["rid"], fid=fid,
                file_offset=p["file_offset"], index=p["index"], phys_offset=pos,
                detail=detail)
    return out.table()


# ------------------------------------------------------------------ message level


@dataclass
class QueueContext:
    """What the per-queue check needs to know about each replica of a group."""

    committed: int
    # rid -> last index whose messages must be in that replica's ConsumeQueues.
    must_index: dict[int, int]
    # rid -> first log position still on disk (units below it point at retained data).
    log_start: dict[int, int]


def check_queue(msgs: pa.Table, units: pa.Table, ctx: QueueContext,
                max_examples: int = 20) -> pa.Table:
    """Check one (group, topic, queue): every replica's units against its messages.

    ``msgs`` and ``units`` hold all replicas' rows for that queue (the
    distribution key). Per replica: units point at real messages of this topic
    and queue with the right size and tag hash, offsets increase with the slot,
    no hole, no message indexed twice, every message that must be dispatched is
    indexed. Across replicas: the same slot points at the same offset.
    """
    out = Findings()
    m_all = msgs.to_pandas() if msgs.num_rows else None
    u_all = units.to_pandas() if units.num_rows else None
    src = m_all if m_all is not None else u_all
    if src is None:
        return out.table()
    gid = int(src["gid"].iloc[0])
    topic = str(src["topic"].iloc[0])
    qid = int(src["queue_id"].iloc[0])
    kw = dict(gid=gid, topic=topic, queue_id=qid)

    def num(r, name: str) -> int:
        v = r.get(name, -1)
        return -1 if v is None or pd.isna(v) else int(v)

    def emit(check, kind, sev, rows, rid, text):
        for _, r in rows.head(max_examples).iterrows():
            out.add(check, kind, sev, rid=rid, fid=num(r, "fid"), slot=num(r, "slot"),
                    phys_offset=num(r, "offset"), index=num(r, "index"), detail=text(r),
                    **kw)
        if len(rows) > max_examples:
            out.add(check, kind, sev, rid=rid, count=len(rows) - max_examples,
                    detail="further occurrences not listed", **kw)

    rids = sorted(set(ctx.must_index))
    slot_maps = []
    for rid in rids:
        m = (m_all[m_all["rid"] == rid] if m_all is not None else pd.DataFrame(
            columns=msgs.schema.names)).sort_values("phys_offset")
        u = (u_all[u_all["rid"] == rid] if u_all is not None else pd.DataFrame(
            columns=units.schema.names)).sort_values("slot")
        if len(u):
            slot_maps.append(u[["slot", "offset"]].assign(rid=rid))
            slots = u["slot"].to_numpy()
            gaps = np.nonzero(np.diff(slots) > 1)[0]
            emit("lost_offsets", "cq_hole", VIOLATION, u.iloc[gaps + 1], rid,
                 lambda r: f"empty slot(s) before slot {r['slot']} after a non-empty slot")
            offs = u["offset"].to_numpy()
            back = np.nonzero(np.diff(offs) <= 0)[0]
            emit("index_validity", "cq_out_of_order", VIOLATION, u.iloc[back + 1], rid,
                 lambda r: f"slot {r['slot']} offset {r['offset']} does not increase")
            twice = u[u.duplicated("offset", keep="first")]
            emit("duplicates", "indexed_twice", VIOLATION, twice, rid,
                 lambda r: f"message at {r['offset']} is indexed again at slot {r['slot']}")
            j = u.merge(m.rename(columns={"phys_offset": "offset", "msg_size": "m_size",
                                          "tag_hash": "m_tag", "fid": "m_fid"})[
                ["offset", "m_size", "m_tag", "index"]], on="offset", how="left")
            start = ctx.log_start.get(rid, 0)
            found = j["m_size"].notna()
            dangling = j[~found & (j["offset"] >= start)]
            emit("index_validity", "cq_dangling", VIOLATION, dangling, rid,
                 lambda r: f"slot {r['slot']} points at {r['offset']}, where no message of "
                           f"{topic}/{qid} starts")
            hit = j[found]
            emit("index_validity", "cq_size_mismatch", VIOLATION,
                 hit[hit["msg_size"] != hit["m_size"]], rid,
                 lambda r: f"slot {r['slot']} size {r['msg_size']}, message is {int(r['m_size'])}")
            emit("index_validity", "cq_tag_mismatch", VIOLATION,
                 hit[hit["tag_hash"] != hit["m_tag"]], rid,
                 lambda r: f"slot {r['slot']} tag hash {r['tag_hash']:#x}, message has "
                           f"{int(r['m_tag']):#x}")
            late = hit[hit["index"] > ctx.committed]
            if len(late):
                r = late.iloc[0]
                out.add("index_validity", "cq_beyond_commit", INFO, rid=rid,
                        slot=int(r["slot"]), phys_offset=int(r["offset"]),
                        index=int(r["index"]), count=len(late),
                        detail=f"{len(late)} units point at entries beyond the known "
                               f"committed index {ctx.committed} (hardstate commit is lazy)",
                        **kw)
        need = m[m["index"] <= ctx.must_index[rid]]
        if len(need):
            indexed = set(u["offset"].tolist()) if len(u) else set()
            miss = need[~need["phys_offset"].isin(indexed)].rename(
                columns={"phys_offset": "offset"})
            emit("index_validity", "cq_not_indexed", VIOLATION, miss, rid,
                 lambda r: f"committed message at {r['offset']} (entry {r['index']}) has no "
                           f"unit in {topic}/{qid}")
    if len(slot_maps) > 1:
        s = pd.concat(slot_maps)
        per = s.groupby("slot")["offset"].nunique()
        clash = per[per > 1]
        for slot in clash.index[:max_examples]:
            views = s[s["slot"] == slot]
            out.add("duplicates", "cq_slot_conflict", VIOLATION, slot=int(slot),
                    count=1, detail="slot points at different offsets on replicas: " + ", ".join(
                        f"rid {r.rid}->{r.offset}" for r in views.itertuples()), **kw)
        if len(clash) > max_examples:
            out.add("duplicates", "cq_slot_conflict", VIOLATION,
                    count=len(clash) - max_examples, detail="further occurrences not listed",
                    **kw)
    return out.table()


def find_duplicate_ids(msgs: pa.Table, max_examples: int = 20) -> pa.Table:
    """The same client identity (producer_id, sequence) at more than one offset.

    ``msgs`` are committed messages of one or more groups (as read from each
    group's source replicas); producer id 0 means "no identity".
    """
    out = Findings()
    if not msgs.num_rows:
        return out.table()
    df = msgs.select(["gid", "producer_id", "sequence", "phys_offset", "index"]).to_pandas()
    df = df[df["producer_id"] != 0]
    dup = df[df.duplicated(["gid", "producer_id", "sequence"], keep=False)]
    if not len(dup):
        return out.table()
    groups = dup.groupby(["gid", "producer_id", "sequence"], sort=True)
    for shown, ((gid, pid, seq), g) in enumerate(groups):
        g = g.sort_values("phys_offset")
        if shown < max_examples:
            out.add("duplicates", "duplicate_client_id", VIOLATION, gid=int(gid),
                    index=int(g["index"].iloc[1]), phys_offset=int(g["phys_offset"].iloc[1]),
                    count=len(g) - 1,
                    detail=f"producer {int(pid) & 0xFFFFFFFFFFFFFFFF:#x} sequence {seq} stored at "
                           + ", ".join(str(x) for x in g["phys_offset"]))
        else:
            out.add("duplicates", "duplicate_client_id", VIOLATION, gid=int(gid),
                    count=len(g) - 1, detail="further occurrences not listed")
    return out.table()


def in_sources(gid: np.ndarray, rid: np.ndarray, index: np.ndarray,
               sources: dict[int, list[tuple[int, int, int]]]) -> np.ndarray:
    """Mask of rows that belong to the committed log as read from its source replicas."""
    mask = np.zeros(len(index), bool)
    for g, spans in sources.items():
        for lo, hi, r in spans:
            mask |= (gid == g) & (rid == r) & (index >= lo) & (index <= hi)
    return mask
