"""Distributed pass 1: every bulk file read once, replicas compared by (group, index range).

Map (one call per file, on an executor):

- segment: the entry headers and body CRCs (``parse.scan_segment``), the
  topic deletions of CONTROL entries, continuity along the file (index gap
  or repeat, term decrease, placement), and, when the history has body
  digests, every record's body against them (``refuted``/``confirmed``
  per entry, ``body_mismatch`` examples). Per-entry rows (replica, file,
  index, term, position, size, CRCs, kind, verdicts) go out keyed by
  ``(LOG, group, index // LOG_CHUNK)``; a summary (first and last entry,
  problems, examples) goes to the driver.
- Raft-index file: its records, keyed the same way.
- ConsumeQueue file, snapshot state: CRC and length (the content key) only.

Reduce (one call per group and index range, every replica's rows together):
per index the versions ``(term, position, size, body_crc)`` and their
votes, the winning version (the history never lets a refuted one win; then
most votes; then the lowest replica holding it, as ``checks.check_group``),
which replicas hold the index and which hold the winner. Consecutive
indexes of the same shape collapse into *runs*, so a healthy range of a
million indexes comes back as one run. Also: the Raft-index records of each
replica against its entries, the rows at the indexes the driver asked for
(snapshots, retention borders) and whether each replica's MESSAGES entries
equal the reference replica's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pandas as pd

from spark_audit import checks, control, digest, flow, fmt, inputs, parse, tasks
from spark_audit.hits import Hit, Hits
from spark_audit.inputs import FileInfo

LOG_CHUNK = 1 << 19  # Raft indexes per reduce call

SEG, INDEX, CQ, CRC = "seg", "index", "cq", "crc"
ENTRIES, RECORDS = 1, 2  # block kinds

# One row per entry header (``parse.ENTRY_DTYPE`` plus who and the body verdicts).
ROW_DTYPE = np.dtype([
    ("rid", "<i4"), ("fid", "<i4"), ("file_offset", "<i8"), ("index", "<i8"), ("term", "<i8"),
    ("position", "<i8"), ("body_crc", "<u4"), ("size", "<i4"), ("kind", "i1"), ("crc_ok", "?"),
    ("has_msgs", "?"), ("refuted", "?"), ("confirmed", "?"),
])
# One row per Raft-index record (``parse.INDEX_OUT_DTYPE`` plus who and where).
IX_DTYPE = np.dtype([
    ("rid", "<i4"), ("fid", "<i4"), ("fstart", "<i8"), ("index", "<i8"), ("position", "<i8"),
    ("term", "<i8"), ("body_crc", "<u4"), ("size", "<i4"), ("kind", "i1"), ("rec_ok", "?"),
])
_VKEY = np.dtype([("index", "<i8"), ("term", "<i8"), ("position", "<i8"), ("size", "<i4"),
                  ("body_crc", "<u4")])


@dataclass(frozen=True)
class Task:
    tid: int
    info: FileInfo
    mode: str

    @property
    def cost(self) -> float:
        return self.info.length * {SEG: 1.0, INDEX: 0.5, CQ: 0.3, CRC: 0.1}[self.mode] + 1e5


@dataclass
class Params:
    """What every map and reduce call of pass 1 needs to know (shipped with the closures)."""

    max_entry_size: int
    max_examples: int
    seg_size: dict[int, int]  # per group: segment size for the placement rule (0: unknown)
    ref: dict[int, int]  # per group: the reference replica
    rids: dict[int, list[int]]  # per group: its replica ids
    probes: dict[int, list[int]]  # per group: indexes whose rows the driver needs
    # per group: (producer_id, sequence, want_crc, where) of sends with a body digest
    digests: dict[int, pd.DataFrame] = field(default_factory=dict)
    # per group: index spans whose per-replica digests to compute (``digest``; each
    # inside one LOG_CHUNK)
    spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


def tasks_for(files: list[FileInfo]) -> list[Task]:
    mode = {inputs.SEGMENT: SEG, inputs.INDEX: INDEX, inputs.CQ: CQ, inputs.SNAPSHOT_STATE: CRC}
    return [Task(i, f, mode[f.kind]) for i, f in enumerate(files)]


# ----------------------------------------------------------------------------- map


def map_file(task: Task, buf: parse.Buffer, p: Params) -> Iterator[flow.Block]:
    """One file's rows and summary (see the module docstring)."""
    t0, c0 = time.perf_counter(), time.process_time()
    f = task.info
    buf = inputs.clip(buf, f)
    out: dict[str, Any] = {"tid": task.tid, "length": len(memoryview(buf))}
    blocks: list[flow.Block] = []
    if task.mode == SEG:
        blocks = _map_segment(task, buf, p, out)
    elif task.mode == INDEX:
        recs, probs = parse.parse_index_file(buf, f.start, f.read_from)
        rows = np.empty(len(recs), IX_DTYPE)
        for name in parse.field_names(parse.INDEX_OUT_DTYPE):
            rows[name] = recs[name]
        rows["rid"], rows["fid"], rows["fstart"] = f.rid, f.fid, f.start
        blocks = list(flow.split_rows(flow.LOG, f.gid, f.rid, RECORDS, rows,
                                      rows["index"] // LOG_CHUNK))
        out.update(n=len(recs), problems=probs)
    elif task.mode == CQ:
        units, probs = tasks.cq_units(buf, f)
        out.update(crc=fmt.crc(memoryview(buf).cast("B")[f.read_from:]), count=len(units),
                   problems=probs)
    else:
        out.update(crc=fmt.crc(memoryview(buf)))
    out.update(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    yield flow.summary(f.gid, task.tid, out)
    yield from blocks


def _map_segment(task: Task, buf: parse.Buffer, p: Params, out: dict[str, Any]
                 ) -> list[flow.Block]:
    f = task.info
    scan = parse.scan_segment(buf, f.start, p.max_entry_size, start=f.read_from)
    e = scan.entries
    rows = np.zeros(len(e), ROW_DTYPE)
    for name in parse.field_names(parse.ENTRY_DTYPE):
        rows[name] = e[name]
    rows["rid"], rows["fid"] = f.rid, f.fid
    hits = Hits(p.max_examples + 1)
    continuity(hits, rows, p.seg_size.get(f.gid, 0), f.gid, f.rid)
    dig = p.digests.get(f.gid)
    if dig is not None and len(dig):
        _body_verdicts(hits, buf, f, rows, dig)
    out.update(n=len(rows), problems=scan.problems,
               deletions=control.topic_deletions(buf, e), hits=hits.dump(),
               first=_edge(rows, 0), last=_edge(rows, -1),
               min_index=int(rows["index"].min()) if len(rows) else 0,
               max_index=int(rows["index"].max()) if len(rows) else 0)
    return list(flow.split_rows(flow.LOG, f.gid, f.rid, ENTRIES, rows,
                                rows["index"] // LOG_CHUNK))


def _edge(rows: np.ndarray, j: int) -> list[int] | None:
    """(index, term, position, size, fid, file_offset) of one row, None if there is none."""
    if not len(rows):
        return None
    r = rows[j]
    return [int(r["index"]), int(r["term"]), int(r["position"]), int(r["size"]), int(r["fid"]),
            int(r["file_offset"])]


def continuity(hits: Hits, rows: np.ndarray, seg: int, gid: int, rid: int) -> None:
    """Index, term and placement anomalies between consecutive entries of one replica's
    log (``rows`` in position order), as ``checks.check_replica_log`` reports them."""
    if len(rows) < 2:
        return
    idx, term, pos = rows["index"], rows["term"], rows["position"]
    size = rows["size"].astype(np.int64)
    fid, foff = rows["fid"], rows["file_offset"]
    for check, kind, mask, text in checks.continuity_rules(idx, term, pos, size, seg):
        at = np.nonzero(mask)[0]
        if not len(at):
            continue
        kept: list[Hit] = [((int(pos[j + 1]),), {
            "fid": int(fid[j + 1]), "file_offset": int(foff[j + 1]), "index": int(idx[j + 1]),
            "phys_offset": int(pos[j + 1]), "detail": text(j)}, int(idx[j]))
            for j in at[:hits.limit]]
        hits.add((check, kind, gid, rid, "", -1), len(at), kept)


def _body_verdicts(hits: Hits, buf: parse.Buffer, f: FileInfo, rows: np.ndarray,
                   dig: pd.DataFrame) -> None:
    """Every record's body against the history's digests (``bodies``), per entry."""
    ents = np.zeros(len(rows), parse.ENTRY_DTYPE)
    for name in parse.field_names(parse.ENTRY_DTYPE):
        ents[name] = rows[name]
    scan = parse.parse_messages(buf, f.start, ents, True)
    m = scan.messages
    if not len(m):
        return
    row_of = np.repeat(np.arange(len(rows)), scan.counts)
    recs = pd.DataFrame({"producer_id": m["producer_id"], "sequence": m["sequence"],
                         "rec": np.arange(len(m))})
    hit = recs[recs["producer_id"] != 0].merge(dig, on=["producer_id", "sequence"])
    if not len(hit):
        return
    rec = hit["rec"].to_numpy()
    bad = m["body_crc"][rec].astype(np.int64) != hit["want_crc"].to_numpy()
    refuted = np.zeros(len(rows), bool)
    np.logical_or.at(refuted, row_of[rec[bad]], True)
    confirmed = np.zeros(len(rows), bool)
    np.logical_or.at(confirmed, row_of[rec[~bad]], True)
    rows["refuted"], rows["confirmed"] = refuted, confirmed & ~refuted
    first_bad: dict[int, tuple[int, int, str]] = {}
    order = np.argsort(rec[bad], kind="stable")
    for r, want, where in zip(rec[bad][order], hit["want_crc"].to_numpy()[bad][order],
                              hit["where"].to_numpy()[bad][order], strict=True):
        first_bad.setdefault(int(row_of[r]), (int(r), int(want), str(where)))
    kept: list[Hit] = []
    at = np.nonzero(refuted)[0]
    for j in at[:hits.limit]:
        r, want, where = first_bad[int(j)]
        x = m[r]
        kept.append(((int(rows["position"][j]),), {
            "fid": f.fid, "file_offset": int(rows["file_offset"][j]),
            "index": int(rows["index"][j]), "phys_offset": int(x["phys_offset"]),
            "detail": f"entry {int(rows['index'][j])}: the record of producer "
                      f"{int(x['producer_id']) & 0xFFFFFFFFFFFFFFFF:#x} sequence "
                      f"{int(x['sequence'])} has body CRC {int(x['body_crc']):#010x}, "
                      f"the body sent ({where}) has {want:#010x}"}, -1))
    hits.add(("history", "body_mismatch", f.gid, f.rid, "", -1), len(at), kept)


# -------------------------------------------------------------------------- reduce


def _by_replica(blocks: list[flow.Block], what: int, dtype: np.dtype, order: str
                ) -> dict[int, np.ndarray]:
    """Rows of each replica, blocks in the order of their first row's ``order`` field
    (each block is one file's rows, already in file order), then sorted if needed."""
    parts: dict[int, list[np.ndarray]] = {}
    for b in blocks:
        if b.what == what:
            parts.setdefault(b.rid, []).append(tasks.unpack(b.data, dtype))
    out = {}
    for rid, ps in sorted(parts.items()):
        ps.sort(key=lambda a: int(a[order][0]) if len(a) else 0)
        rows = np.concatenate(ps) if len(ps) > 1 else ps[0]
        if len(rows) > 1 and not bool((np.diff(rows[order]) > 0).all()):
            rows = rows[np.lexsort((rows["fid"], rows[order]))]
        out[rid] = rows
    return out


def reduce_log(key: flow.Key, blocks: list[flow.Block], p: Params) -> bytes:
    """Compare every replica's entries (and Raft-index records) of one index range."""
    c0 = time.process_time()
    _, gid, _ = key
    per = _by_replica(blocks, ENTRIES, ROW_DTYPE, "position")
    ix_per = _by_replica(blocks, RECORDS, IX_DTYPE, "index")
    # Every replica's rows in (replica, position) order, as the checks read them.
    e = np.concatenate(list(per.values())) if per else np.zeros(0, ROW_DTYPE)
    out: dict[str, Any] = {"runs": [], "bad": [], "probe_rows": [], "probe_best": [],
                           "ix": {}, "diff_ref": [], "digests": []}
    probes = set(p.probes.get(gid, []))
    firsts: dict[int, np.ndarray] = {}  # each replica's first row per index
    uniform = bool(per) and _uniform(per)
    if uniform:
        _versions_uniform(per, out, probes)
        firsts = per
    elif len(e):
        # One row per (replica, index): the first in log order.
        ri = np.empty(len(e), [("rid", "<i4"), ("index", "<i8")])
        ri["rid"], ri["index"] = e["rid"], e["index"]
        d = e[np.sort(np.unique(ri, return_index=True)[1])]
        _versions(d, out, probes)
        firsts = {int(r): d[d["rid"] == r] for r in per}
    if probes and len(e):
        at = e[np.isin(e["index"], np.array(sorted(probes), np.int64))]
        out["probe_rows"] = [[int(r["rid"]), int(r["index"]), int(r["term"]),
                              int(r["position"]), int(r["size"])] for r in at]
    ref = p.ref.get(gid, 0)
    out["diff_ref"] = _differ_from_ref(per, ref, p.rids.get(gid, []), uniform)
    spans = [s for s in p.spans.get(gid, []) if s[0] // LOG_CHUNK == key[2]]
    if spans:
        for rid in p.rids.get(gid, []):
            mine = per.get(rid, np.zeros(0, ROW_DTYPE))
            for (lo, hi), (n, hexd) in zip(spans, digest.of_spans(mine, spans), strict=True):
                out["digests"].append([lo, hi, rid, n, hexd])
    for rid in sorted(set(ix_per) | set(firsts)):
        out["ix"][rid] = _index_partial(ix_per.get(rid, np.zeros(0, IX_DTYPE)),
                                        firsts.get(rid, np.zeros(0, ROW_DTYPE)), gid, rid,
                                        p.max_examples + 1)
    out["cpu"] = time.process_time() - c0
    return msgpack.packb(out, use_bin_type=True)


def _differ_from_ref(per: dict[int, np.ndarray], ref: int, rids: list[int], uniform: bool
                     ) -> list[int]:
    """The replicas whose MESSAGES entries here are not the reference replica's (same
    versions, every body intact), which decode their own records in pass 2."""
    empty = np.zeros(0, ROW_DTYPE)
    ref_all = per.get(ref, empty)
    out = []
    for rid in rids:
        if rid == ref:
            continue
        other_all = per.get(rid, empty)
        if uniform and rid in per and ref in per:
            # Same versions of the same indexes: compare which are MESSAGES, and bodies.
            same = (np.array_equal(other_all["has_msgs"], ref_all["has_msgs"])
                    and bool(ref_all["crc_ok"][ref_all["has_msgs"]].all())
                    and bool(other_all["crc_ok"][other_all["has_msgs"]].all()))
        else:
            ref_rows = ref_all[ref_all["has_msgs"]]
            other = other_all[other_all["has_msgs"]]
            same = (len(other) == len(ref_rows) and bool(ref_rows["crc_ok"].all())
                    and bool(other["crc_ok"].all())
                    and all(np.array_equal(other[n], ref_rows[n])
                            for n in parse.field_names(_VKEY)))
        if not same:
            out.append(int(rid))
    return out


def _uniform(per: dict[int, np.ndarray]) -> bool:
    """Every replica holds the same versions of the same indexes, once each, with the
    same verdicts (the usual case: a range the replicas agree on)."""
    rows = list(per.values())
    r0 = rows[0]
    if len(r0) > 1 and not bool((np.diff(r0["index"]) > 0).all()):
        return False
    names = (*parse.field_names(_VKEY), "refuted", "confirmed")
    return all(len(r) == len(r0) and all(np.array_equal(r[n], r0[n]) for n in names)
               for r in rows[1:])


def _versions_uniform(per: dict[int, np.ndarray], out: dict[str, Any], probes: set[int]
                      ) -> None:
    """``_versions`` when every replica holds one identical version of each index."""
    r0 = next(iter(per.values()))
    u = r0["index"]
    intact = np.zeros(len(r0), bool)
    for r in per.values():
        intact |= r["crc_ok"]
    mask = sum(1 << rid for rid in per)
    refuted, confirmed = r0["refuted"], r0["confirmed"]
    brk = np.r_[True, (np.diff(u) != 1) | (refuted[1:] != refuted[:-1])
                | (confirmed[1:] != confirmed[:-1]) | (intact[1:] != intact[:-1])]
    lo_at = np.nonzero(brk)[0]
    hi_at = np.r_[lo_at[1:] - 1, len(u) - 1]

    def ver(j: int) -> list[int]:
        return [int(r0["term"][j]), int(r0["position"][j]), int(r0["size"][j]),
                int(r0["body_crc"][j])]

    for a, b in zip(lo_at.tolist(), hi_at.tolist(), strict=True):
        out["runs"].append([int(u[a]), int(u[b]), len(per), 1, int(not refuted[a]),
                            int(refuted[a]), int(confirmed[a]), int(intact[a]), mask, mask,
                            ver(a), ver(b)])
    for j in np.nonzero(np.isin(u, np.array(sorted(probes), np.int64)))[0]:
        out["probe_best"].append([int(u[j]), *ver(int(j))])


def _versions(d: np.ndarray, out: dict[str, Any], probes: set[int]) -> None:
    """Per index: versions, votes, the winner, holders; then runs of equal shape."""
    key = np.empty(len(d), _VKEY)
    for name in parse.field_names(_VKEY):
        key[name] = d[name]
    uk, vid = np.unique(key, return_inverse=True)
    vid = vid.reshape(-1)
    nv = len(uk)
    votes = np.bincount(vid, minlength=nv)
    refuted = np.zeros(nv, bool)
    np.logical_or.at(refuted, vid, d["refuted"])
    confirmed = np.zeros(nv, bool)
    np.logical_or.at(confirmed, vid, d["confirmed"])
    intact = np.zeros(nv, bool)
    np.logical_or.at(intact, vid, d["crc_ok"])
    first = np.full(nv, len(d), np.int64)
    np.minimum.at(first, vid, np.arange(len(d)))
    vindex = uk["index"]
    ob = np.lexsort((first, -votes, refuted, vindex))
    starts = np.r_[True, vindex[ob][1:] != vindex[ob][:-1]]
    best = ob[starts]
    u = vindex[best]
    of_v = np.searchsorted(u, vindex)
    nver = np.bincount(of_v, minlength=len(u))
    nopen = np.bincount(of_v, weights=~refuted, minlength=len(u)).astype(np.int64)
    at = np.searchsorted(u, d["index"])
    bit = np.left_shift(np.int64(1), d["rid"].astype(np.int64))
    holders = np.zeros(len(u), np.int64)
    np.bitwise_or.at(holders, at, bit)
    match = np.zeros(len(u), np.int64)
    ok = vid == best[at]
    np.bitwise_or.at(match, at[ok], bit[ok])
    shape = np.stack([votes[best], nver, nopen, refuted[best], confirmed[best], intact[best],
                      holders, match], axis=1).astype(np.int64)
    brk = np.r_[True, (np.diff(u) != 1) | (shape[1:] != shape[:-1]).any(axis=1)]
    lo_at = np.nonzero(brk)[0]
    hi_at = np.r_[lo_at[1:] - 1, len(u) - 1]
    bv = uk[best]

    def ver(j: int) -> list[int]:
        return [int(bv["term"][j]), int(bv["position"][j]), int(bv["size"][j]),
                int(bv["body_crc"][j])]

    for a, b in zip(lo_at.tolist(), hi_at.tolist(), strict=True):
        out["runs"].append([int(u[a]), int(u[b]), *shape[a].tolist(), ver(a), ver(b)])
        bad = int(shape[a][6]) & ~int(shape[a][7])
        if bad:
            sel = np.nonzero((d["index"] == u[a])
                             & (np.bitwise_and(bit, bad) != 0))[0]
            for j in sel:
                r = d[j]
                out["bad"].append([int(r["rid"]), int(r["index"]), int(r["fid"]),
                                   int(r["file_offset"]), int(r["term"]), int(r["position"]),
                                   int(r["size"]), int(r["body_crc"])])
    for j in np.nonzero(np.isin(u, np.array(sorted(probes), np.int64)))[0]:
        out["probe_best"].append([int(u[j]), *ver(int(j))])


def _complete(ix: np.ndarray, en: np.ndarray) -> bool:
    """One intact record per entry, agreeing with it, in the same order."""
    return (len(ix) == len(en) and bool(ix["rec_ok"].all())
            and all(np.array_equal(ix[c], en[c])
                    for c in ("index", "position", "term", "size", "kind", "body_crc")))


def _index_partial(ix: np.ndarray, en: np.ndarray, gid: int, rid: int, limit: int
                   ) -> dict[str, Any]:
    """One replica's Raft-index records against its entries, over one index range
    (``checks.check_index_files`` in pieces; see ``dgroup.index_findings``)."""
    cols = ("position", "term", "size", "kind", "body_crc")
    if _complete(ix, en):
        # Every entry has its record and every record its entry (the usual case).
        return {"bad_crc": [0, 0, -1], "wrong": [], "missing": [0, 0], "extra": []}
    ix = ix[np.lexsort((ix["index"], ix["fstart"]))]
    # The last record of each index (files in start order), as the checks keep it.
    rev = ix[::-1]
    ix = rev[np.sort(np.unique(rev["index"], return_index=True)[1])][::-1]
    bad = ix[~ix["rec_ok"]]
    out: dict[str, Any] = {"bad_crc": [len(bad), int(bad["index"][0]) if len(bad) else 0,
                                       int(bad["fid"][0]) if len(bad) else -1]}
    good = ix[ix["rec_ok"]]
    common, gi, ei = np.intersect1d(good["index"], en["index"], return_indices=True)
    a, b = good[gi], en[ei]
    wrong = np.zeros(len(common), bool)
    for c in cols:
        wrong |= a[c].astype(np.int64) != b[c].astype(np.int64)
    hits = Hits(limit)
    w = np.nonzero(wrong)[0]

    def show(r: np.ndarray) -> dict[str, int]:
        return {c: int(r[c]) for c in cols}

    hits.add(("index_validity", "raft_index_mismatch", gid, rid, "", -1), len(w), [
        ((int(common[j]),), {"fid": int(a["fid"][j]), "index": int(common[j]),
                             "phys_offset": int(b["position"][j]),
                             "detail": f"index record {show(a[j])} != entry {show(b[j])}"}, -1)
        for j in w[:limit]])
    out["wrong"] = hits.dump()
    missing = np.setdiff1d(en["index"], ix["index"])
    out["missing"] = [len(missing), int(missing[0]) if len(missing) else 0]
    out["extra"] = runs_of(np.setdiff1d(good["index"], en["index"]))
    return out


def runs_of(values: np.ndarray) -> list[list[int]]:
    """Sorted distinct integers as [first, last] runs of consecutive values."""
    if not len(values):
        return []
    brk = np.nonzero(np.diff(values) != 1)[0]
    lo = np.r_[values[:1], values[brk + 1]]
    hi = np.r_[values[brk], values[-1:]]
    return [[int(a), int(b)] for a, b in zip(lo, hi, strict=True)]


def read_task(task: Task) -> Any:
    """The bytes of a local file task (``tasks.read_file``)."""
    return tasks.read_file(task.info)
