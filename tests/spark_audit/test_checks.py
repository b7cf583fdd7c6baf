"""The pure pieces alone: result blobs, partitioning, identities, queue and duplicate checks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_audit import checks, inputs, parse, replicas, tasks
from spark_audit.checks import Findings, QueueBounds


def test_pack_round_trips_extreme_values():
    m = np.zeros(6, parse.MSG_DTYPE)
    m["phys_offset"] = [5, 3, 2**62, -7, 0, 2**63 - 1]
    m["producer_id"] = [-1, 2, 3, -(2**63), 2**63 - 1, 0]
    m["tag_hash"] = [0xFFFFFFFF, 0, 1, 2, 3, -5]
    m["topic"] = [1, 2, 3, 4, 5, -1]
    assert (tasks.unpack(tasks.pack(m), parse.MSG_DTYPE) == m).all()
    counts = np.array([64, 0, 3], np.int32)
    assert tasks.unpack(tasks.pack(counts), counts.dtype).tolist() == [64, 0, 3]
    assert len(tasks.unpack(tasks.pack(np.zeros(0, parse.ENTRY_DTYPE)), parse.ENTRY_DTYPE)) == 0


def test_result_rows_round_trip():
    res = tasks.FileResult(7, entries=np.ones(2, parse.ENTRY_DTYPE),
                           messages=np.ones(3, parse.MSG_DTYPE), counts=np.array([1, 2], "<i4"),
                           topics=["a", "b"], problems=[(1, 2, "body_crc", "x")],
                           msg_problems=[(3, 4, "bad_message", "y", 1)], crc=99, length=10,
                           count=4, seconds=0.5, cpu=0.25)
    (back,) = tasks.from_table(pa.Table.from_batches([tasks.to_batch(res)]))
    assert back.tid == 7 and back.topics == ["a", "b"] and back.index is None
    assert (back.entries == res.entries).all() and (back.messages == res.messages).all()
    assert back.problems == res.problems and back.msg_problems == res.msg_problems
    assert (back.crc, back.length, back.count, back.seconds, back.cpu) == (99, 10, 4, 0.5, 0.25)


def _task(tid: int, length: int, mode: str) -> tasks.FileTask:
    return tasks.FileTask(tid, inputs.FileInfo(tid, 0, 0, f"/f{tid}", inputs.SEGMENT, length),
                          mode)


def test_balance_deals_every_task_once_heaviest_partition_first():
    todo = [_task(i, (i + 1) * 1000, tasks.SCAN_MSGS if i % 3 == 0 else tasks.SCAN)
            for i in range(10)]
    parts = tasks.balance(todo, 3)
    assert sorted(t.tid for p in parts for t in p) == list(range(10))
    loads = [sum(t.cost for t in p) for p in parts]
    assert loads == sorted(loads, reverse=True)
    assert len(tasks.balance(todo[:2], 8)) == 2


def test_distinct_values_tell_trailing_nul_and_length_apart():
    rows = np.frombuffer(b"ab\x00\x00ab\x00\x00abc\x00ab\x00\x00", np.uint8).reshape(4, 4)
    ids, values = parse.distinct_values(rows, np.array([2, 3, 3, 2]))
    assert [values[i] for i in ids] == [b"ab", b"ab\x00", b"abc", b"ab"]
    wide = np.frombuffer(b"long-topic-x" * 2, np.uint8).reshape(2, 12)
    ids, values = parse.distinct_values(wide, np.array([12, 10]))
    assert [values[i] for i in ids] == [b"long-topic-x", b"long-topic"]


def _msgs(offsets, index=None, size=100, tag=0) -> np.ndarray:
    m = np.zeros(len(offsets), replicas.QUEUE_MSG_DTYPE)
    m["phys_offset"] = offsets
    m["index"] = index if index is not None else np.arange(1, len(offsets) + 1)
    m["size"] = size
    m["tag_hash"] = tag
    return m


def _units(offsets, slots=None, size=100, tag=0) -> np.ndarray:
    u = np.zeros(len(offsets), parse.UNIT_DTYPE)
    u["offset"] = offsets
    u["slot"] = slots if slots is not None else np.arange(len(offsets))
    u["size"] = size
    u["tag_hash"] = tag
    return u


def _queue(msgs, units, committed=10, must=10, log_start=0) -> list[tuple]:
    out = Findings()
    checks.check_queue_replica(out, 0, "t", 1, 2, msgs, units, np.full(len(units), 9),
                               lambda phys: np.full(len(phys), 8), QueueBounds(
                                   committed, must, log_start))
    return [(r["kind"], r["severity"], r["slot"], r["phys_offset"], r["index"], r["fid"])
            for r in out.rows]


def test_queue_check_clean_and_each_fault():
    m = _msgs([100, 300, 500, 700])
    assert _queue(m, _units([100, 300, 500, 700])) == []
    # Units only up to the dispatched point are fine when must_index says so.
    assert _queue(m, _units([100, 300]), must=2) == []
    assert _queue(m, _units([100, 300]), must=3) == [
        ("cq_not_indexed", "violation", -1, 500, 3, 8)]
    assert _queue(m, _units([100, 300, 500], slots=[0, 1, 3]), must=3) == [
        ("cq_hole", "violation", 3, 500, -1, 9)]
    assert _queue(m, _units([100, 500, 300, 700])) == [
        ("cq_out_of_order", "violation", 2, 300, -1, 9)]
    assert _queue(m, _units([100, 300, 300, 700])) == [
        ("cq_out_of_order", "violation", 2, 300, -1, 9),
        ("indexed_twice", "violation", 2, 300, -1, 9),
        ("cq_not_indexed", "violation", -1, 500, 3, 8)]
    assert _queue(m, _units([100, 301, 500, 700])) == [
        ("cq_dangling", "violation", 1, 301, -1, 9),
        ("cq_not_indexed", "violation", -1, 300, 2, 8)]
    # Below the log start (retention) a unit has no message to point at: fine.
    assert _queue(m[1:], _units([100, 300, 500, 700]), log_start=200) == []
    assert _queue(m, _units([100, 300, 500, 700], size=[100, 99, 100, 100])) == [
        ("cq_size_mismatch", "violation", 1, 300, 2, 9)]
    assert _queue(m, _units([100, 300, 500, 700], tag=[0, 0, 5, 0])) == [
        ("cq_tag_mismatch", "violation", 2, 500, 3, 9)]
    assert _queue(m, _units([100, 300, 500, 700]), committed=2, must=2) == [
        ("cq_beyond_commit", "info", 2, 500, 3, -1)]


def test_queue_check_caps_examples():
    m = _msgs(np.arange(1, 31) * 100)
    rows = _queue(m, _units([]), must=30)
    assert len(rows) == 21 and rows[-1][0] == "cq_not_indexed"


def test_slot_conflicts_name_the_replicas():
    out = Findings()
    checks.slot_conflicts(out, 0, "t", 1, [(0, _units([100, 300, 500])),
                                           (1, _units([100, 301, 500])),
                                           (2, _units([100, 300]))])
    (row,) = out.rows
    assert (row["slot"], row["kind"]) == (1, "cq_slot_conflict")
    assert row["detail"].endswith("rid 0->300, rid 1->301, rid 2->300")


def _ids(pid, seq) -> np.ndarray:
    m = np.zeros(len(pid), parse.MSG_DTYPE)
    m["producer_id"], m["sequence"] = pid, seq
    m["phys_offset"] = np.arange(len(pid)) * 10
    m["index"] = np.arange(len(pid)) + 1
    return m


def test_duplicate_client_ids():
    def found(m):
        out = Findings()
        checks.find_duplicate_ids(out, 0, m)
        return [(r["index"], r["phys_offset"], r["count"]) for r in out.rows]

    assert found(_ids([1, 2, 1, 2], [1, 1, 2, 2])) == []
    # Sequences not increasing per producer, yet distinct: the slow path agrees.
    assert found(_ids([1, 1, 1], [5, 3, 4])) == []
    # Producer id 0 means "no identity".
    assert found(_ids([0, 0], [1, 1])) == []
    assert found(_ids([7, 1, 7, 7], [3, 3, 3, 4])) == [(3, 20, 1)]


def _replica(rid: int, crc_ok: list[bool]) -> replicas.ReplicaLog:
    e = np.zeros(len(crc_ok), parse.ENTRY_DTYPE)
    e["index"] = np.arange(1, len(crc_ok) + 1)
    e["position"] = np.arange(len(crc_ok)) * 1000
    e["file_offset"] = e["position"]
    e["size"], e["term"], e["kind"] = 1000, 1, 1
    e["crc_ok"], e["has_msgs"] = crc_ok, True
    return replicas.ReplicaLog(0, rid, e, np.full(len(e), rid, np.int32))


def test_identities_decode_what_no_decoded_replica_shares():
    g = replicas.Group(0, 0, {0: _replica(0, [True] * 4), 1: _replica(1, [True, False, True,
                                                                          True]),
                              2: _replica(2, [True] * 4)})
    g.assign_identities()
    assert (g.replicas[0].eid == g.replicas[2].eid).all()
    assert g.replicas[1].eid[1] not in g.replicas[0].eid  # a failing CRC shares nothing
    g.decoded[g.replicas[0].eid] = True  # the reference replica decoded in pass 1
    ((rep, rows),) = g.missing()
    assert (rep.rid, rows.tolist()) == (1, [1])
    g.assign_identities(share=False)
    assert not set(g.replicas[0].eid) & set(g.replicas[2].eid)
