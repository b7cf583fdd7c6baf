"""Distributed pass 2: messages against ConsumeQueues, duplicates and histories, by key.

Once pass 1 fixed each group's committed index, each replica's agreement
and the sources of the committed log, the driver knows every replica's
queue bounds, which topic deletions it applied and which replica each
committed index is read from. Map (one call per file):

- segment: its message records (``parse.parse_messages``), keyed by
  ``(OFFSET, group, position // OFFSET_CHUNK)``; the committed ones (read
  from this replica) also by ``(IDS, group, bucket of the identity)``;
- ConsumeQueue file: its units, keyed by the position they point at, and by
  ``(SLOT, group, queue and slot range)`` for queues whose files differ
  between replicas; holes and order along the file go to the driver;
- the history's keys: by identity and by the position of their message id.

Reduce: per position range, every replica's units of each queue joined with
its messages of that queue at the same position (dangling, size, tag,
twice-indexed units, messages without a unit, units beyond the commit) and
the history's positions; per slot range, the replicas' units of one slot
(``cq_slot_conflict``); per identity bucket, committed messages sharing an
identity (``duplicate_client_id``) and the history's identities. Findings
keep their first examples and counts (``hits``).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit import checks, dlog, flow, inputs, parse, tasks
from spark_audit.hits import Hit, Hits
from spark_audit.inputs import FileInfo

OFFSET_CHUNK = 1 << 27  # log bytes per reduce call (positions)
SLOT_CHUNK = 1 << 20  # queue slots per reduce call
ID_RECORDS = 1 << 18  # committed records per identity bucket, about

SEG, CQ, KEYS = "seg", "cq", "keys"
MSGS, UNITS, KEYS_OFF, KEYS_ID, CIDS, NAMES = 1, 2, 3, 4, 5, 6  # block kinds

# ``mask``: bit r set when replica r holds this record (or unit): a record is
# decoded once, from the reference replica, for every replica whose entries of
# that index range are the reference's; a ConsumeQueue file once per content.
MSG_DTYPE = np.dtype([
    ("mask", "<i8"), ("index", "<i8"), ("phys", "<i8"), ("size", "<i4"), ("tag", "<i8"),
    ("topic", "<i8"), ("queue", "<i4"), ("committed", "?"), ("pid", "<i8"), ("seq", "<i8"),
])
UNIT_DTYPE = np.dtype([
    ("mask", "<i8"), ("fid", "<i4"), ("fstart", "<i8"), ("slot", "<i8"), ("offset", "<i8"),
    ("tag", "<i8"), ("size", "<i4"), ("topic", "<i8"), ("queue", "<i4"),
])
CID_DTYPE = np.dtype([("pid", "<i8"), ("seq", "<i8"), ("index", "<i8"), ("phys", "<i8"),
                      ("span", "<i4")])
KID_DTYPE = np.dtype([("pid", "<i8"), ("seq", "<i8")])
KOFF_DTYPE = np.dtype([("phys", "<i8")])


def topic_hash(name: str) -> int:
    """A stable 63-bit id of a topic name (the same in every process)."""
    h = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Task:
    tid: int
    info: FileInfo | None
    mode: str
    keys: pa.Table | None = None  # KEYS: the history's lookup keys
    mask: int = 0  # CQ: the replicas holding this file's content

    @property
    def cost(self) -> float:
        if self.info is None:
            return 1e5
        return self.info.length * (5.0 if self.mode == SEG else 1.0) + 1e5


@dataclass
class Params:
    """What pass 2's map and reduce calls need (small: per group and replica)."""

    max_entry_size: int
    max_examples: int
    ref: dict[int, int]
    # per group and replica: (committed, must_index, log_start, log_end) as
    # ``checks.QueueBounds``
    bounds: dict[int, dict[int, tuple[int, int, int, int]]]
    dead: dict[int, dict[int, dict[str, int]]]  # per group, replica: topic -> D
    spans: dict[int, list[tuple[int, int, int]]]  # per group: the committed log's sources
    rids: dict[int, list[int]]
    # per group and replica other than the reference: index ranges (``dlog.LOG_CHUNK``)
    # where its MESSAGES entries differ from the reference's (it decodes its own there)
    own: dict[int, dict[int, set[int]]]
    # (group, replica, topic, queue, first slot) -> file id of each ConsumeQueue file
    cq_fids: dict[tuple[int, int, str, int, int], int]
    slot_queues: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    id_buckets: dict[int, int] = field(default_factory=dict)  # per group (``bucket``)


# ----------------------------------------------------------------------------- map


def map_file(task: Task, buf: parse.Buffer | None, p: Params) -> Iterator[flow.Block]:
    t0, c0 = time.perf_counter(), time.process_time()
    out: dict[str, Any] = {"tid": task.tid}
    blocks: list[flow.Block] = []
    if task.mode == KEYS:
        blocks = _map_keys(task, p)
    elif task.mode == SEG:
        assert buf is not None and task.info is not None
        blocks = _map_segment(task.info, inputs.clip(buf, task.info), p, out)
    else:
        assert buf is not None and task.info is not None
        blocks = _map_cq(task.info, inputs.clip(buf, task.info), p, out, task.mask)
    out.update(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    yield flow.summary(task.info.gid if task.info else -1, task.tid, out)
    yield from blocks


def _map_keys(task: Task, p: Params) -> list[flow.Block]:
    k = task.keys
    if k is None or not k.num_rows:
        return []
    blocks: list[flow.Block] = []
    gid_all = k.column("gid").to_numpy()
    for gid in np.unique(gid_all):
        sel = gid_all == gid
        pid = k.column("producer_id").to_numpy()[sel]
        seq = k.column("sequence").to_numpy()[sel]
        off = k.column("phys_offset").to_numpy()[sel]
        ids = np.zeros(int((pid != 0).sum()), KID_DTYPE)
        ids["pid"], ids["seq"] = pid[pid != 0], seq[pid != 0]
        blocks += flow.split_rows(flow.IDS, int(gid), -1, KEYS_ID, ids,
                                  bucket(ids["pid"], ids["seq"], p.id_buckets.get(int(gid), 1)))
        offs = np.zeros(int((off >= 0).sum()), KOFF_DTYPE)
        offs["phys"] = off[off >= 0]
        blocks += flow.split_rows(flow.OFFSET, int(gid), -1, KEYS_OFF, offs,
                                  offs["phys"] // OFFSET_CHUNK)
    return blocks


def bucket(pid: np.ndarray, seq: np.ndarray, n: int) -> np.ndarray:
    """The identity bucket of each (producer id, sequence): every copy of one identity
    lands in one bucket, and one producer's records spread over all of them."""
    h = (pid.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        seq.view(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
    b: np.ndarray = (h >> np.uint64(33)).astype(np.int64) % max(n, 1)
    return b


def _names_block(space: int, gid: int, chunks: np.ndarray, names: dict[int, str]
                 ) -> list[flow.Block]:
    data = msgpack.packb(names, use_bin_type=True)
    return [flow.Block(space, gid, int(c), -1, NAMES, data) for c in np.unique(chunks)]


def _map_segment(f: FileInfo, buf: parse.Buffer, p: Params, out: dict[str, Any]
                 ) -> list[flow.Block]:
    scan = parse.scan_segment(buf, f.start, p.max_entry_size, bodies=False, start=f.read_from)
    ents = scan.entries
    ref = p.ref.get(f.gid, 0)
    own = p.own.get(f.gid, {})
    if f.rid != ref:  # only where this replica's entries are not the reference's
        mine = own.get(f.rid, set())
        ents = ents.copy()
        ents["has_msgs"] &= np.isin(ents["index"] // dlog.LOG_CHUNK,
                                    np.array(sorted(mine), np.int64))
    ms = parse.parse_messages(buf, f.start, ents)
    m = ms.messages
    hashes = np.array([topic_hash(t) for t in ms.topics] or [0], np.int64)
    rows = np.zeros(len(m), MSG_DTYPE)
    rows["index"], rows["phys"], rows["size"] = m["index"], m["phys_offset"], m["size"]
    rows["tag"], rows["queue"] = m["tag_hash"], m["queue_id"]
    rows["topic"] = hashes[m["topic"]] if len(m) else 0
    rows["pid"], rows["seq"] = m["producer_id"], m["sequence"]
    rows["mask"] = 1 << f.rid
    if f.rid == ref:
        chunk = rows["index"] // dlog.LOG_CHUNK
        for rid in p.rids.get(f.gid, []):
            if rid != ref:
                rows["mask"] |= np.where(np.isin(chunk, np.array(sorted(own.get(rid, set())),
                                                                 np.int64)), 0, 1 << rid)
    span_no = np.full(len(m), -1, np.int32)
    for k, (lo, hi, src) in enumerate(p.spans.get(f.gid, [])):
        span_no[(rows["index"] >= lo) & (rows["index"] <= hi)
                & (np.right_shift(rows["mask"], src) & 1).astype(bool)] = k
    rows["committed"] = span_no >= 0
    out.update(n=len(m), problems=[list(x[:4]) for x in ms.problems],
               topics=sorted(set(ms.topics)))
    names = {int(h): t for h, t in zip(hashes.tolist(), ms.topics, strict=False)}
    chunk = rows["phys"] // OFFSET_CHUNK
    blocks = list(flow.split_rows(flow.OFFSET, f.gid, f.rid, MSGS, rows, chunk))
    blocks += _names_block(flow.OFFSET, f.gid, chunk, names)
    c = rows["committed"] & (rows["pid"] != 0)
    if c.any():
        ids = np.zeros(int(c.sum()), CID_DTYPE)
        ids["pid"], ids["seq"] = rows["pid"][c], rows["seq"][c]
        ids["index"], ids["phys"], ids["span"] = rows["index"][c], rows["phys"][c], span_no[c]
        blocks += flow.split_rows(flow.IDS, f.gid, f.rid, CIDS, ids,
                                  bucket(ids["pid"], ids["seq"], p.id_buckets.get(f.gid, 1)))
    return blocks


def _map_cq(f: FileInfo, buf: parse.Buffer, p: Params, out: dict[str, Any], mask: int
            ) -> list[flow.Block]:
    units, _ = tasks.cq_units(buf, f)
    th = topic_hash(f.topic)
    rows = np.zeros(len(units), UNIT_DTYPE)
    rows["mask"], rows["fid"], rows["topic"], rows["queue"] = mask, f.fid, th, f.queue_id
    rows["fstart"] = f.start
    rows["slot"], rows["offset"] = units["slot"], units["offset"]
    rows["tag"], rows["size"] = units["tag_hash"], units["size"]
    hits = Hits(p.max_examples + 1)
    unit_order(hits, rows, f.gid, f.rid, f.topic, f.queue_id)
    edge = [[int(rows["slot"][j]), int(rows["offset"][j]), f.fid] for j in (0, -1)] if len(
        rows) else None
    out.update(n=len(rows), hits=hits.dump(), edge=edge)
    chunk = rows["offset"] // OFFSET_CHUNK
    blocks = list(flow.split_rows(flow.OFFSET, f.gid, f.rid, UNITS, rows, chunk))
    blocks += _names_block(flow.OFFSET, f.gid, chunk, {th: f.topic})
    if (f.topic, f.queue_id) in p.slot_queues.get(f.gid, set()):
        key = np.array([slot_chunk(th, f.queue_id, s) for s in
                        np.unique(rows["slot"] // SLOT_CHUNK).tolist()], np.int64)
        per = np.searchsorted(np.unique(rows["slot"] // SLOT_CHUNK), rows["slot"] // SLOT_CHUNK)
        blocks += flow.split_rows(flow.SLOT, f.gid, f.rid, UNITS, rows, key[per])
        blocks += _names_block(flow.SLOT, f.gid, key, {th: f.topic})
    return blocks


def slot_chunk(topic: int, queue: int, chunk: int) -> int:
    """The key of one slot range of one queue."""
    h = hashlib.blake2b(f"{topic}/{queue}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def unit_order(hits: Hits, u: np.ndarray, gid: int, rid: int, topic: str, queue: int) -> None:
    """Holes and offsets that do not increase along consecutive units (slot order)."""
    if len(u) < 2:
        return
    slots, offs, fid = u["slot"], u["offset"], u["fid"]
    key = ("lost_offsets", "cq_hole", gid, rid, topic, queue)
    gaps = np.nonzero(np.diff(slots) > 1)[0] + 1
    hits.add(key, len(gaps), [_unit_hit(fid, slots, offs, j, f"empty slot(s) before slot "
                                        f"{slots[j]} after a non-empty slot")
                              for j in gaps[:hits.limit]])
    back = np.nonzero(np.diff(offs) <= 0)[0] + 1
    hits.add(("index_validity", "cq_out_of_order", gid, rid, topic, queue), len(back), [
        _unit_hit(fid, slots, offs, j, f"slot {slots[j]} offset {offs[j]} does not increase")
        for j in back[:hits.limit]])


def _unit_hit(fid: np.ndarray, slots: np.ndarray, offs: np.ndarray, j: int, detail: str,
              index: int = -1) -> Hit:
    return ((int(slots[j]),), {"fid": int(fid[j]), "slot": int(slots[j]),
                               "phys_offset": int(offs[j]), "index": index, "detail": detail},
            -1)


# -------------------------------------------------------------------------- reduce


def reduce(key: flow.Key, blocks: list[flow.Block], p: Params) -> bytes:
    """The reduce call of a position range, slot range or identity bucket (with its CPU
    seconds appended as 8 bytes, for the timings)."""
    c0 = time.process_time()
    return _reduce(key, blocks, p) + struct.pack("<d", time.process_time() - c0)


def _reduce(key: flow.Key, blocks: list[flow.Block], p: Params) -> bytes:
    space, gid, _ = key
    names: dict[int, str] = {}
    for b in blocks:
        if b.what == NAMES:
            names.update({int(k): v for k, v in msgpack.unpackb(
                b.data, raw=False, strict_map_key=False).items()})
    if space == flow.OFFSET:
        return _reduce_offsets(gid, blocks, names, p)
    if space == flow.SLOT:
        return _reduce_slots(gid, blocks, names, p)
    return _reduce_ids(gid, blocks, p)


def _bits(mask: np.ndarray, rid: int) -> np.ndarray:
    held: np.ndarray = (np.right_shift(mask, rid) & 1).astype(bool)
    return held


def _reduce_offsets(gid: int, blocks: list[flow.Block], names: dict[int, str], p: Params
                    ) -> bytes:
    msgs = flow.unpack_rows(blocks, MSGS, MSG_DTYPE)
    units = flow.unpack_rows(blocks, UNITS, UNIT_DTYPE)
    koff = flow.unpack_rows(blocks, KEYS_OFF, KOFF_DTYPE)
    hits = Hits(p.max_examples + 1)
    out: dict[str, Any] = {"beyond": [], "counts": {}, "dead": {}, "queues": [], "hist": []}
    msgs = _sorted_by(msgs, "phys")
    units = _sorted_by(units, "slot")
    ref = p.ref.get(gid, 0)
    out["queues"] = sorted([names[t], q] for t, q in _queues(msgs))
    fid_key = {fid: k[2:] for k, fid in p.cq_fids.items() if k[0] == gid}
    done: list[tuple[int, np.ndarray, np.ndarray, Any, Hits, list[list[Any]]]] = []
    for rid in p.rids.get(gid, []):
        mb, ub = _bits(msgs["mask"], rid), _bits(units["mask"], rid)
        dead_map = p.dead.get(gid, {}).get(rid, {})
        bnd = p.bounds[gid][rid]
        if mb.any():
            out["counts"][rid] = int(mb.sum())
        # A replica holding exactly the rows an earlier one held, with the same bounds,
        # gets that one's findings (with its own file ids): computed once.
        twin = next((d for d in done if _twins(d[1], mb) and _twins(d[2], ub)
                     and d[3] == (bnd, dead_map)), None)
        if twin is not None:
            _copy_queue_findings(hits, out, twin[4], twin[5], rid, gid, fid_key, p)
            if rid == ref and dead_map:
                _count_dead(out, msgs[mb], dead_map)
            continue
        mine = Hits(p.max_examples + 1)
        beyond: list[list[Any]] = []
        m = msgs if bool(mb.all()) else msgs[mb]
        if rid == ref:
            _count_dead(out, m, dead_map)
        dead = np.zeros(len(m), bool)
        for topic, before in dead_map.items():
            dead |= (m["topic"] == topic_hash(topic)) & (m["index"] < before)
        if dead.any():
            m = m[~dead]
        u = units if bool(ub.all()) else units[ub]
        # Already in position (slot) order: a stable sort by queue keeps it.
        mc, mq_pairs = _queue_codes(m)
        uc, uq_pairs = _queue_codes(u)
        m = m[np.argsort(mc, kind="stable")]
        u = u[np.argsort(uc, kind="stable")]
        for th, q in sorted(set(mq_pairs) | set(uq_pairs)):
            mq = m[_range(m, th, q)]
            uq = u[_range(u, th, q)]
            starts = np.unique(uq["fstart"])
            fids = np.array([p.cq_fids[(gid, rid, names[th], q, int(x))] for x in starts],
                            np.int32)
            ufid = fids[np.searchsorted(starts, uq["fstart"])] if len(uq) else uq["fid"]
            late = _queue(mine, gid, rid, names[th], q, mq, uq, ufid,
                          checks.QueueBounds(*bnd))
            if late is not None:
                beyond.append([rid, names[th], q, *late])
        _copy_queue_findings(hits, out, mine, beyond, rid, gid, {}, p)
        done.append((rid, mb, ub, (bnd, dead_map), mine, beyond))
    if len(koff):
        c = msgs[msgs["committed"] & np.isin(msgs["phys"], koff["phys"])]
        out["hist"] = [[int(a), int(b), int(x)] for a, b, x in zip(
            c["pid"], c["seq"], c["phys"], strict=True)]
    out["hits"] = hits.dump()
    return msgpack.packb(out, use_bin_type=True)


def _sorted_by(rows: np.ndarray, name: str) -> np.ndarray:
    """Rows in ``name`` order (stable; usually they already are)."""
    v = rows[name]
    if len(v) < 2 or bool((v[1:] >= v[:-1]).all()):
        return rows
    sorted_rows: np.ndarray = rows[np.argsort(v, kind="stable")]
    return sorted_rows


def _queue_codes(rows: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """A small integer per row's (topic, queue), numbered in (topic, queue) order, and
    the distinct (topic, queue) in that order (hash-based: no sort of the rows)."""
    if not len(rows):
        return np.zeros(0, np.int64), []
    ct, ut = pd.factorize(rows["topic"], sort=True)
    comb = (ct.astype(np.int64) << 32) | rows["queue"].astype(np.int64)
    codes, uniq = pd.factorize(comb, sort=True)
    pairs = [(int(ut[c >> 32]), int(c & 0xFFFFFFFF)) for c in uniq.tolist()]
    return codes.astype(np.int64), pairs


def _twins(a: np.ndarray, b: np.ndarray) -> bool:
    """Two replicas hold the same rows (their bits in the rows' masks agree)."""
    return bool(np.array_equal(a, b))


def _queues(rows: np.ndarray) -> set[tuple[int, int]]:
    """The distinct (topic, queue) of rows."""
    return set(_queue_codes(rows)[1])


def _range(rows: np.ndarray, topic: int, queue: int) -> slice:
    """The rows of one queue in rows sorted by (topic, queue)."""
    key = rows["topic"]
    a, b = np.searchsorted(key, [topic, topic + 1]) if topic < (1 << 63) - 1 else (
        int(np.searchsorted(key, topic)), len(key))
    qs = rows["queue"][a:b]
    lo, hi = np.searchsorted(qs, [queue, queue + 1])
    return slice(int(a + lo), int(a + hi))


def _count_dead(out: dict[str, Any], m: np.ndarray, dead_map: dict[str, int]) -> None:
    for topic, before in dead_map.items():
        n = int(((m["topic"] == topic_hash(topic)) & (m["index"] < before)).sum())
        out["dead"][topic] = out["dead"].get(topic, 0) + n


def _copy_queue_findings(hits: Hits, out: dict[str, Any], src: Hits, beyond: list[list[Any]],
                         rid: int, gid: int, fid_key: dict[int, tuple[Any, ...]], p: Params
                         ) -> None:
    """Add one replica's queue findings, or a twin's relabelled (its files' ids)."""
    for key, (n, kept) in src.streams.items():
        rows = []
        for o, f, x in kept:
            if fid_key and f.get("fid", -1) >= 0:
                t, q, start = fid_key[f["fid"]]
                f = {**f, "fid": p.cq_fids[(gid, rid, t, q, start)]}
            rows.append((o, f, x))
        hits.add((*key[:3], rid, *key[4:]), n, rows)
    out["beyond"] += [[rid, *b[1:]] for b in beyond]


def _queue(hits: Hits, gid: int, rid: int, topic: str, q: int, m: np.ndarray, u: np.ndarray,
           ufid: np.ndarray, bounds: checks.QueueBounds) -> list[int] | None:
    """``checks.check_queue_replica`` over the units and messages of one position range
    (holes and order along the slots are checked per file, ``unit_order``)."""
    slots, offs = u["slot"], u["offset"]
    m_off = m["phys"]
    late_out = None
    if len(u):
        again = np.zeros(len(offs), bool)
        if len(u) > 1 and not bool((offs[1:] > offs[:-1]).all()):
            order = np.argsort(offs, kind="stable")
            again[order[1:][offs[order][1:] == offs[order][:-1]]] = True
        tw = np.nonzero(again)[0]
        hits.add(("duplicates", "indexed_twice", gid, rid, topic, q), len(tw), [
            _unit_hit(ufid, slots, offs, j,
                      f"message at {offs[j]} is indexed again at slot {slots[j]}")
            for j in tw[:hits.limit]])
        at = np.searchsorted(m_off, offs)
        at_c = np.minimum(at, max(len(m_off) - 1, 0))
        found = ((at < len(m_off)) & (m_off[at_c] == offs)) if len(m_off) else np.zeros(
            len(offs), bool)
        m_idx = np.where(found, m["index"][at_c] if len(m_off) else -1, -1)
        dg = np.nonzero(~found & (offs >= bounds.log_start))[0]
        hits.add(("index_validity", "cq_dangling", gid, rid, topic, q), len(dg), [
            _unit_hit(ufid, slots, offs, j, f"slot {slots[j]} points at {offs[j]}, where "
                                                f"no message of {topic}/{q} starts")
            for j in dg[:hits.limit]])
        if len(m_off):
            m_size, m_tag = m["size"][at_c], m["tag"][at_c]
            sb = np.nonzero(found & (u["size"] != m_size))[0]
            hits.add(("index_validity", "cq_size_mismatch", gid, rid, topic, q), len(sb), [
                _unit_hit(ufid, slots, offs, j, f"slot {slots[j]} size {u['size'][j]}, "
                                                    f"message is {m_size[j]}", int(m_idx[j]))
                for j in sb[:hits.limit]])
            tb = np.nonzero(found & (u["tag"] != m_tag))[0]
            hits.add(("index_validity", "cq_tag_mismatch", gid, rid, topic, q), len(tb), [
                _unit_hit(ufid, slots, offs, j, f"slot {slots[j]} tag hash "
                                                    f"{u['tag'][j]:#x}, message has "
                                                    f"{m_tag[j]:#x}", int(m_idx[j]))
                for j in tb[:hits.limit]])
            late = np.nonzero(found & (m_idx > bounds.committed))[0]
            if len(late):
                j = late[0]
                late_out = [len(late), int(slots[j]), int(offs[j]), int(m_idx[j])]
    need = np.nonzero(m["index"] <= bounds.must_index)[0]
    if len(need):
        if (len(offs) >= len(need) and need[-1] == len(need) - 1
                and np.array_equal(offs[:len(need)], m_off[:len(need)])):
            indexed = np.ones(len(need), bool)  # the usual case: units are the messages
        elif len(u):
            indexed = np.isin(m_off[need], offs)
        else:
            indexed = np.zeros(len(need), bool)
        miss = need[~indexed]
        hits.add(("index_validity", "cq_not_indexed", gid, rid, topic, q), len(miss), [
            ((int(m_off[j]),), {"fid": -2, "slot": -1, "phys_offset": int(m_off[j]),
                                "index": int(m["index"][j]),
                                "detail": f"committed message at {m_off[j]} (entry "
                                          f"{m['index'][j]}) has no unit in {topic}/{q}"}, -1)
            for j in miss[:hits.limit]])
    return late_out


def _reduce_slots(gid: int, blocks: list[flow.Block], names: dict[int, str], p: Params
                  ) -> bytes:
    held = flow.unpack_rows(blocks, UNITS, UNIT_DTYPE)
    per = [(rid, held[_bits(held["mask"], rid)]) for rid in p.rids.get(gid, [])]
    units = np.concatenate([u for _, u in per]) if per else held
    rids = np.concatenate([np.full(len(u), rid, np.int32) for rid, u in per]) if per else (
        np.zeros(0, np.int32))
    order = np.lexsort((units["slot"], rids))
    units, rids = units[order], rids[order]
    hits = Hits(p.max_examples + 1)
    for th, q in sorted(set(zip(units["topic"].tolist(), units["queue"].tolist(),
                                strict=True))):
        sel = (units["topic"] == th) & (units["queue"] == q)
        u, rid = units[sel], rids[sel]
        slot, off = u["slot"], u["offset"]
        order = np.lexsort((off, slot))
        s, o = slot[order], off[order]
        clash = np.unique(s[1:][(s[1:] == s[:-1]) & (o[1:] != o[:-1])])
        kept: list[Hit] = []
        for c in clash[:hits.limit]:
            at = np.nonzero(slot == c)[0]
            kept.append(((int(c),), {
                "slot": int(c), "count": 1,
                "detail": "slot points at different offsets on replicas: " + ", ".join(
                    f"rid {rid[j]}->{off[j]}" for j in at)}, -1))
        hits.add(("duplicates", "cq_slot_conflict", gid, -1, names[th], q), len(clash), kept)
    return msgpack.packb({"hits": hits.dump()}, use_bin_type=True)


def _reduce_ids(gid: int, blocks: list[flow.Block], p: Params) -> bytes:
    ids = flow.unpack_rows(blocks, CIDS, CID_DTYPE)
    keys = flow.unpack_rows(blocks, KEYS_ID, KID_DTYPE)
    ids = ids[np.lexsort((ids["phys"], ids["span"]))]  # the committed log's order
    out: dict[str, Any] = {"dups": [], "hist": []}
    pid, seq = ids["pid"], ids["seq"]
    order = np.lexsort((seq, pid))
    ps, ss = pid[order], seq[order]
    same = (ps[1:] == ps[:-1]) & (ss[1:] == ss[:-1])
    if same.any():
        edge = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        for a, b in zip(np.nonzero(edge == 1)[0], np.nonzero(edge == -1)[0], strict=True):
            rows = order[a:b + 1]
            out["dups"].append([int(ps[a]), int(ss[a]), int(ids["index"][rows[1]]),
                                int(ids["phys"][rows[1]]), len(rows) - 1,
                                [int(x) for x in ids["phys"][rows]]])
    if len(keys) and len(ids):
        want = set(zip(keys["pid"].tolist(), keys["seq"].tolist(), strict=True))
        out["hist"] = [[a, b, x] for a, b, x in zip(pid.tolist(), seq.tolist(),
                                                    ids["phys"].tolist(), strict=True)
                       if (a, b) in want]
    return msgpack.packb(out, use_bin_type=True)
