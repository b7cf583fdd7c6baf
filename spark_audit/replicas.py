"""Who decodes what: entry identities, the pool of decoded messages, per-replica views.

Two entries with the same (index, term, position, size, body_crc) whose bodies
both pass their CRC hold the same bytes, so their message records need to be
decoded once. The audit therefore decodes every message record of one
*reference* replica per group (the first scan, ``tasks.SCAN_MSGS``) and, in
a second pass, only the entries no decoded replica shares (divergent or
extra entries, and bodies that fail their CRC). Each distinct entry gets an
identity id (``eid``); decoded records are pooled by eid, and any replica's
messages are the pooled records of its eids in log order.

ConsumeQueue files work the same way: a file's content key is (topic, queue,
first slot, length, CRC); the reference replica's units are decoded in the
first pass, other replicas' files only when their content key is new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit import parse, tasks
from spark_audit.inputs import FileInfo

# A ConsumeQueue file's content: (topic, queue id, first slot, length, CRC), its
# view when a cut or window drops some units (``inputs.View``), and the replica id
# when identical files are not shared (``cq_content_key``).
ContentKey: TypeAlias = tuple[Any, ...]


class ProblemRow(TypedDict):
    """One row of ``problems_table``: a parse problem and where it was found."""

    gid: int
    rid: int
    fid: int
    file_offset: int
    index: int
    problem: str
    detail: str


_KEY_DTYPE = np.dtype([("index", "<i8"), ("term", "<i8"), ("position", "<i8"),
                       ("size", "<i4"), ("body_crc", "<u4"), ("rid", "<i8")])


class Topics:
    """Global ids of topic names (the parsers number topics per file)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.names)
            self.names.append(name)
        return self.ids[name]

    def remap(self, local: list[str], values: np.ndarray) -> np.ndarray:
        lut = np.array([self.id(t) for t in local] or [0], np.int32)
        remapped: np.ndarray = lut[values]
        return remapped

    def qkey(self, topic_ids: np.ndarray, queue_ids: np.ndarray) -> np.ndarray:
        """One int64 per (topic, queue id)."""
        return (topic_ids.astype(np.int64) << 32) | (queue_ids.astype(np.int64) & 0xFFFFFFFF)

    def split(self, qkey: int) -> tuple[str, int]:
        qid = qkey & 0xFFFFFFFF
        return self.names[qkey >> 32], qid - (1 << 32) if qid >= 1 << 31 else qid


@dataclass
class ReplicaLog:
    """One replica's parsed log and ConsumeQueue files."""

    gid: int
    rid: int
    entries: np.ndarray = field(default_factory=lambda: np.zeros(0, parse.ENTRY_DTYPE))
    fid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    eid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    index: np.ndarray = field(default_factory=lambda: np.zeros(0, parse.INDEX_OUT_DTYPE))
    index_fid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # qkey -> [(file, content key)] in slot order
    cq: dict[int, list[tuple[FileInfo, ContentKey]]] = field(default_factory=dict)

    @property
    def msg_eids(self) -> np.ndarray:
        """Identity ids of this replica's MESSAGES entries, in log order."""
        eids: np.ndarray = self.eid[self.entries["has_msgs"]]
        return eids

    def entry_fid(self, phys: np.ndarray) -> np.ndarray:
        """Segment file id of the entries holding these log positions."""
        at = np.searchsorted(self.entries["position"], phys, side="right") - 1
        fids: np.ndarray = self.fid[np.maximum(at, 0)]
        return fids


@dataclass
class Group:
    gid: int
    ref: int  # the reference replica (all its records are decoded in the first pass)
    replicas: dict[int, ReplicaLog]
    n_eids: int = 0
    # Pool of decoded records: per-eid lists until ``seal``, then CSR arrays.
    _parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    decoded: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    pool: np.ndarray = field(default_factory=lambda: np.zeros(0, parse.MSG_DTYPE))
    pool_start: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    # (eid, log position, index, kind, detail) of records that failed to decode
    msg_problems: list[tuple[int, int, int, str, str]] = field(default_factory=list)
    _views: dict[int, np.ndarray] = field(default_factory=dict)

    def assign_identities(self, share: bool = True) -> None:
        """An eid per entry: shared by identical CRC-valid entries, unique otherwise.

        With ``share`` false no two replicas share an eid, so every replica's
        records are decoded from its own bytes (the cross-check mode).
        """
        reps = [self.replicas[r] for r in sorted(self.replicas)]
        ents = np.concatenate([r.entries for r in reps]) if reps else np.zeros(
            0, parse.ENTRY_DTYPE)
        keys = np.zeros(len(ents), _KEY_DTYPE)
        for name in parse.field_names(_KEY_DTYPE)[:-1]:
            keys[name] = ents[name]
        if not share:
            keys["rid"] = np.concatenate([np.full(len(r.entries), r.rid) for r in reps]
                                         or [np.zeros(0, np.int64)])
        ok = ents["crc_ok"]
        eid = np.empty(len(ents), np.int64)
        uniq, inv = np.unique(keys[ok], return_inverse=True)
        eid[ok] = inv.reshape(-1)
        eid[~ok] = len(uniq) + np.arange(int((~ok).sum()))
        self.n_eids = len(uniq) + int((~ok).sum())
        at = 0
        for r in reps:
            r.eid = eid[at:at + len(r.entries)]
            at += len(r.entries)
        self.decoded = np.zeros(self.n_eids, bool)

    def add_decoded(self, eids: np.ndarray, res: tasks.FileResult, info: FileInfo,
                    topics: Topics) -> None:
        """Pool the records of a ``msgs``/``scan_msgs`` result whose entries had ``eids``."""
        msgs = tasks.produced(res.messages)  # fresh (unpacked, or this process's own parse)
        msgs["topic"] = topics.remap(res.topics, msgs["topic"])
        self._parts.append((np.repeat(eids, tasks.produced(res.counts)), msgs))
        self.decoded[eids] = True
        for file_offset, index, kind, detail, row in res.msg_problems:
            self.msg_problems.append((int(eids[row]), info.start + file_offset, index, kind,
                                      detail))

    def missing(self) -> list[tuple[ReplicaLog, np.ndarray]]:
        """(replica, entry rows) to decode so that every MESSAGES entry's eid is pooled.

        Each missing eid is decoded once, from the lowest replica id holding it.
        """
        out = []
        todo = np.zeros(self.n_eids, bool)
        for r in (self.replicas[k] for k in sorted(self.replicas)):
            rows = np.nonzero(r.entries["has_msgs"])[0]
            rows = rows[~self.decoded[r.eid[rows]] & ~todo[r.eid[rows]]]
            # An eid held twice by one replica (a repeated entry) is decoded once.
            rows = rows[np.unique(r.eid[rows], return_index=True)[1]]
            if len(rows):
                todo[r.eid[rows]] = True
                out.append((r, np.sort(rows)))
        return out

    def seal(self) -> None:
        """Turn the pooled parts into one array sorted by eid (records in log order)."""
        if self._parts:
            eids = np.concatenate([e for e, _ in self._parts])
            msgs = np.concatenate([m for _, m in self._parts])
        else:
            eids, msgs = np.zeros(0, np.int64), np.zeros(0, parse.MSG_DTYPE)
        # Usually already in eid order (the reference replica's log order).
        self.pool = msgs if _ascending(eids) else msgs[np.argsort(eids, kind="stable")]
        counts = np.bincount(eids, minlength=self.n_eids)
        self.pool_start = np.zeros(self.n_eids + 1, np.int64)
        np.cumsum(counts, out=self.pool_start[1:])
        self._parts = []

    def message_count(self, rid: int) -> int:
        e = self.replicas[rid].msg_eids
        return int((self.pool_start[e + 1] - self.pool_start[e]).sum())

    def messages(self, rid: int) -> np.ndarray:
        """Replica ``rid``'s message records in log order (gathered from the pool)."""
        if rid not in self._views:
            e = self.replicas[rid].msg_eids
            if len(e) and e[-1] - e[0] == len(e) - 1 and (np.diff(e) == 1).all():
                # Consecutive eids (the usual case): a view of the pool, no copy.
                self._views[rid] = self.pool[self.pool_start[e[0]]:self.pool_start[e[-1] + 1]]
                return self._views[rid]
            lens = self.pool_start[e + 1] - self.pool_start[e]
            total = int(lens.sum())
            ends = np.cumsum(lens)
            take = np.repeat(self.pool_start[e] - (ends - lens), lens) + np.arange(total)
            self._views[rid] = self.pool[take]
        return self._views[rid]

    def committed_messages(self, sources: list[tuple[int, int, int]]) -> np.ndarray:
        """The committed log's records, each span read from its source replica."""
        parts = []
        for lo, hi, rid in sources:
            m = self.messages(rid)
            idx = m["index"]
            if _ascending(idx):
                a, b = np.searchsorted(idx, [lo, hi + 1])
                parts.append(m[a:b])
            else:
                parts.append(m[(idx >= lo) & (idx <= hi)])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, parse.MSG_DTYPE)

    def problem_rows(self) -> list[ProblemRow]:
        """Decode problems, reported on every replica holding the entry (same bytes)."""
        rows: list[ProblemRow] = []
        if not self.msg_problems:
            return rows
        for r in self.replicas.values():
            where = {int(e): j for j, e in enumerate(r.eid)}
            for eid, phys, index, kind, detail in self.msg_problems:
                j = where.get(eid)
                if j is None:
                    continue
                e = r.entries[j]
                rows.append(ProblemRow(gid=self.gid, rid=r.rid, fid=int(r.fid[j]),
                                       file_offset=int(e["file_offset"] + phys - e["position"]),
                                       index=index, problem=kind, detail=detail))
        return rows


def _ascending(a: np.ndarray) -> bool:
    return bool(len(a) < 2 or (a[1:] >= a[:-1]).all())


def problems_table(rows: list[ProblemRow]) -> pa.Table:
    """Problem rows as the table ``checks.problem_findings`` reads."""
    names = ["gid", "rid", "fid", "file_offset", "index", "problem", "detail"]
    types = [pa.int32(), pa.int32(), pa.int32(), pa.int64(), pa.int64(), pa.string(),
             pa.string()]
    cells: Sequence[Mapping[str, object]] = rows  # read by column name
    return pa.table({n: pa.array([r[n] for r in cells], t)
                     for n, t in zip(names, types, strict=True)})


def entries_table(reps: list[ReplicaLog]) -> pa.Table:
    """Entries of replicas as the table ``checks.check_group`` reads."""
    def col(name: str) -> np.ndarray:
        parts = [r.entries[name] for r in reps]
        return np.concatenate(parts) if parts else np.zeros(0, parse.ENTRY_DTYPE[name])

    n = [len(r.entries) for r in reps]
    return pa.table({
        "gid": pa.array(np.concatenate([np.full(k, r.gid, np.int32) for k, r in zip(
            n, reps, strict=True)] or [np.zeros(0, np.int32)])),
        "rid": pa.array(np.concatenate([np.full(k, r.rid, np.int32) for k, r in zip(
            n, reps, strict=True)] or [np.zeros(0, np.int32)])),
        "fid": pa.array(np.concatenate([r.fid for r in reps] or [np.zeros(0, np.int32)])),
        "file_offset": pa.array(col("file_offset")),
        "index": pa.array(col("index")),
        "term": pa.array(col("term")),
        "position": pa.array(col("position")),
        "size": pa.array(col("size")),
        "kind": pa.array(col("kind")),
        "body_crc": pa.array(col("body_crc").astype(np.int64)),
        "crc_ok": pa.array(col("crc_ok")),
    })


def index_table(rep: ReplicaLog) -> pa.Table:
    """Raft-index records of one replica as ``checks.check_index_files`` reads them."""
    x = rep.index
    return pa.table({
        "fid": pa.array(rep.index_fid), "index": pa.array(x["index"]),
        "position": pa.array(x["position"]), "term": pa.array(x["term"]),
        "size": pa.array(x["size"]), "kind": pa.array(x["kind"]),
        "body_crc": pa.array(x["body_crc"].astype(np.int64)), "rec_ok": pa.array(x["rec_ok"]),
    })


def cq_content_key(info: FileInfo, res: tasks.FileResult, share: bool = True) -> ContentKey:
    """Identifies a ConsumeQueue file's bytes: equal keys mean equal units.

    Without ``share`` the replica is part of the key: every file is decoded.
    """
    key: ContentKey = (info.topic, info.queue_id, info.start, res.length, res.crc)
    if info.view is not None:
        key = (*key, info.view)
    return key if share else (*key, info.rid)


def queue_units(rep: ReplicaLog, qkey: int, units: dict[ContentKey, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(units in slot order, file id of each) of one queue of one replica."""
    files = rep.cq.get(qkey, [])
    parts = [units[ck] for _, ck in files]
    if not parts:
        return np.zeros(0, parse.UNIT_DTYPE), np.zeros(0, np.int32)
    u = np.concatenate(parts) if len(parts) > 1 else parts[0]
    fid = np.concatenate([np.full(len(p), f.fid, np.int32) for p, (f, _) in zip(
        parts, files, strict=True)])
    if _ascending(u["slot"]):  # files in start order hold ascending slots
        return u, fid
    order = np.argsort(u["slot"], kind="stable")
    return u[order], fid[order]


# What the queue check reads of a message.
QUEUE_MSG_DTYPE = np.dtype([("phys_offset", "<i8"), ("index", "<i8"), ("tag_hash", "<i8"),
                            ("size", "<i4")])


def queue_slices(msgs: np.ndarray, topics: Topics) -> dict[int, np.ndarray]:
    """A replica's records split by (topic, queue), each in log order (QUEUE_MSG_DTYPE)."""
    if not len(msgs):
        return {}
    q = topics.qkey(msgs["topic"], msgs["queue_id"])
    # Few distinct queues per group: factorize, then a stable radix sort of small codes.
    codes, uniq = pd.factorize(q, sort=True)
    order = np.argsort(codes.astype(np.int16 if len(uniq) < 1 << 15 else np.int64),
                       kind="stable")
    compact = np.empty(len(msgs), QUEUE_MSG_DTYPE)
    for name in parse.field_names(QUEUE_MSG_DTYPE):
        compact[name] = msgs[name][order]
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    return {int(uniq[j]): compact[bounds[j]:bounds[j + 1]] for j in range(len(uniq))}
