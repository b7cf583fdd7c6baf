"""Topic deletion: dead messages are not unindexed, indexing them again is caught.

A ``topic.delete`` CONTROL entry (the broker's msgpack schema) at entry D
makes the topic's messages in earlier entries dead: a broker that applied it
indexes none of them, and the re-created topic starts at queue offset 0.
Replicas are written with the audit's own format writer (``replica_builder``).
"""

from __future__ import annotations

import os

import msgpack
import numpy as np

from spark_audit import control, fmt, parse
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine

from . import scenarios
from .replica_builder import Entry, encode_entry, make_log, write_replica

DELETE_AT = 31


def _body(*ops: dict) -> bytes:
    return msgpack.packb({"v": 1, "ops": list(ops)}, use_bin_type=True)


def _log() -> list[Entry]:
    """30 entries over two topics, "orders" deleted by entry 31, then 20 more
    (the name re-created by sends)."""
    log = make_log(scenarios.batches(DELETE_AT - 1))
    log.append(Entry(DELETE_AT, 1, fmt.KIND_CONTROL, body=_body(
        {"op": "offsets.commit", "offsets": [["g", "orders", 0, 3]]},
        {"op": "topic.delete", "topic": "orders"})))
    return log + make_log(scenarios.batches(20, producer=7), first_index=DELETE_AT + 1)


def _write(root: str, skips: dict[str, dict[str, int] | None], **kw) -> None:
    for node, skip in skips.items():
        write_replica(os.path.join(root, node), _log(), segment_size=scenarios.SEGMENT,
                      units_per_file=scenarios.UNITS, index_file_records=64, skip_before=skip,
                      **kw.get(node, {}))


def violations(res) -> set[tuple[str, str, int]]:
    return {(r["check"], r["kind"], r["rid"]) for r in res.findings.to_pylist()
            if r["severity"] == "violation"}


def test_deletions_are_read_from_control_entries():
    body = _body({"op": "topic.delete", "topic": "a"}, {"op": "topic.delete", "topic": 5},
                 {"op": "topic.put", "topic": "b", "queues": 4})
    buf = b"".join(encode_entry(i, 1, fmt.KIND_CONTROL, at, b) for i, at, b in (
        (4, 0, body), (5, 48 + len(body), b"\xc1 not msgpack"),
        (6, 48 * 2 + len(body) + 14, _body({"op": "topic.delete", "topic": "c"}))))
    scan = parse.scan_segment(buf, 0)
    assert control.topic_deletions(buf, scan.entries) == [(4, "a"), (6, "c")]
    # A body that fails its CRC is not read.
    scan.entries["crc_ok"][2] = False
    assert control.topic_deletions(buf, scan.entries) == [(4, "a")]
    assert control.topic_deletions(buf, np.zeros(0, parse.ENTRY_DTYPE)) == []


def test_dead_messages_need_no_unit(tmp_path):
    skip = {"orders": DELETE_AT}
    _write(str(tmp_path / "g"), dict.fromkeys(scenarios.NODES, skip))
    res = run_audit(AuditOptions([str(tmp_path / "g")]), LocalEngine())
    assert res.valid, violations(res)
    (info,) = [r for r in res.findings.to_pylist() if r["kind"] == "topic_deleted"]
    # Entries 1..30 hold 4 messages each, every other one of "orders".
    assert (info["topic"], info["index"], info["count"], info["severity"]) == (
        "orders", DELETE_AT, 2 * (DELETE_AT - 1), "info")


def test_a_replica_that_indexes_dead_messages_is_caught(tmp_path):
    """n2 resurrects the deleted messages (its queues still index them, the
    re-created topic's messages follow at later slots); n3 has not applied the
    deletion yet (dispatched up to entry 25), which is not a fault."""
    skip = {"orders": DELETE_AT}
    _write(str(tmp_path / "g"), {"n1": skip, "n2": None, "n3": None},
           n3={"dispatched_index": 25})
    res = run_audit(AuditOptions([str(tmp_path / "g")]), LocalEngine())
    got = violations(res)
    assert ("index_validity", "cq_dangling", 1) in got
    assert ("duplicates", "cq_slot_conflict", -1) in got
    assert {rid for _, _, rid in got} == {1, -1}


def test_the_distributed_audit_reads_deletions_the_same(tmp_path):
    """Resurrected and not-yet-deleted messages: the distributed passes (in this
    process) give the in-process rows."""
    from spark_audit.engine import LocalFlowEngine

    skip = {"orders": DELETE_AT}
    _write(str(tmp_path / "g"), {"n1": skip, "n2": None, "n3": None},
           n3={"dispatched_index": 25})
    opts = AuditOptions([str(tmp_path / "g")])
    key = ["check", "kind", "severity", "gid", "rid", "fid", "index", "topic", "queue_id",
           "slot", "phys_offset", "count", "detail"]
    a, b = run_audit(opts, LocalEngine()), run_audit(opts, LocalFlowEngine())
    assert sorted(a.findings.select(key).to_pylist(), key=repr) == sorted(
        b.findings.select(key).to_pylist(), key=repr)
    assert "topic_deleted" in b.findings.column("kind").to_pylist()


def test_a_window_below_a_deletion_is_told_of_it(tmp_path):
    """A window that ends before the deleting entry does not read it, while every replica
    applied it and dropped the topic's queues: the deletion, known from outside the
    window (the nightly manifest keeps those its new ranges held), makes the window's
    messages of the topic dead; unknown, they would be messages without a unit. (With
    the Raft-index files gone the window cannot read past its cut either, see below.)"""
    from spark_audit import window
    from spark_audit.engine import LocalFlowEngine

    _write(str(tmp_path / "g"), {key: {"orders": DELETE_AT} for key in scenarios.NODES})
    _remove_index_files(tmp_path / "g")
    bounds = {"g": window.Bounds(5, 20)}
    blind = run_audit(AuditOptions([str(tmp_path / "g")], bounds=bounds), LocalEngine())
    assert ("index_validity", "cq_not_indexed", 0) in violations(blind)
    unread = {r["rid"] for r in blind.findings.to_pylist()
              if r["kind"] == "deletions_past_cut_unread"}
    assert unread == {0, 1, 2}, unread
    for eng in (LocalEngine(), LocalFlowEngine()):
        told = run_audit(AuditOptions([str(tmp_path / "g")], bounds=bounds,
                                      deletions={"g": [(DELETE_AT, "orders")]}), eng)
        assert told.valid, violations(told)
    # The whole log's audit reports the deletion it read, for the manifest.
    whole = run_audit(AuditOptions([str(tmp_path / "g")]), LocalEngine())
    assert whole.deletions == {0: [(DELETE_AT, "orders")]}


def _remove_index_files(root) -> None:
    for path in root.glob("*/index/*"):
        path.unlink()


def test_a_cut_reads_the_deletions_its_replicas_applied_past_it(tmp_path):
    """A live cut: a broker applies a deletion committed after the cut before the
    audit reads its queue files, so the topic's queues are gone while the deleting
    entry lies past the cut. The window reads the CONTROL entries between the cut and
    what each replica dispatched (through their Raft-index records), so the dead
    messages are told as such, not as messages without a unit; both engines alike.
    A replica that has not applied the deletion yet still indexes them, and is judged
    on them as before."""
    from spark_audit import window
    from spark_audit.engine import LocalFlowEngine

    skip = {"orders": DELETE_AT}
    _write(str(tmp_path / "g"), {"n1": skip, "n2": skip, "n3": None},
           n3={"dispatched_index": 25})
    opts = AuditOptions([str(tmp_path / "g")], bounds={"g": window.Bounds(1, 20)})
    key = ["check", "kind", "severity", "gid", "rid", "fid", "index", "topic", "queue_id",
           "slot", "phys_offset", "count", "detail"]
    a, b = run_audit(opts, LocalEngine()), run_audit(opts, LocalFlowEngine())
    assert a.valid, violations(a)
    assert sorted(a.findings.select(key).to_pylist(), key=repr) == sorted(
        b.findings.select(key).to_pylist(), key=repr)
    (info,) = [r for r in a.findings.to_pylist() if r["kind"] == "topic_deleted"]
    assert (info["topic"], info["index"], info["severity"]) == ("orders", DELETE_AT, "info")
    # Entries 1..20 hold 4 messages each, every other one of "orders".
    assert info["count"] == 2 * 20
    assert not [r for r in a.findings.to_pylist() if r["kind"] == "deletions_past_cut_unread"]
    # The deletions past a cut count only for the window, never for the manifest:
    # the night that reads the deleting entry records it.
    assert not any(a.deletions.values())
