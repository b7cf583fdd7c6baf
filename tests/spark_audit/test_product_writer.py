"""The audit against files written by the product itself (commitlog + consumequeue).

The audit has its own reader of docs/storage-format.md and never imports the
storage code; the other audit tests write replicas with the audit's own
test writer (``replica_builder``). Here three replicas are written by the real
``CommitLog`` and ``ConsumeQueueStore`` (the same entries on each), audited
clean by both engines, then damaged in copies (a flipped body byte, a
truncated segment, a rewritten ConsumeQueue unit) and audited again. This is
what proves the audit reads what the product writes.
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

from commitlog import (
    KIND_CONTROL,
    KIND_MESSAGES,
    KIND_NOOP,
    CommitLog,
    CommitLogConfig,
    HardState,
    Message,
    decode_messages,
    encode_messages,
    tag_hash,
)
from consumequeue import ConsumeQueueStore
from spark_audit import parse
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine

NODES = ("n1", "n2", "n3")
CONFIG = CommitLogConfig(segment_size_bytes=16384, index_file_records=16)
UNITS_PER_FILE = 20
TOPICS = ("orders", "audit-log")
PRODUCER = 0xFEEDFACECAFEBEEF


def _batch(i: int) -> list[Message]:
    """Four messages over two topics and three queues, with tags, keys and properties."""
    return [Message(TOPICS[(i + j) % 2], bytes([65 + j]) * (200 + 13 * j), queue_id=(i + j) % 3,
                    tags="red" if j % 2 else "", keys=f"k{i} k{j}",
                    properties={"TRACE": f"{i}-{j}"}, producer_id=PRODUCER,
                    sequence=4 * i + j, born_host="10.1.2.3:4567",
                    born_timestamp_ms=1_700_000_000_000 + i, store_timestamp_ms=1_700_000_000_500)
            for j in range(4)]


# (term, kind, body) of every entry, identical on each replica: messages in
# term 1, a new leader's NOOP and a CONTROL entry in term 2, more messages.
ENTRIES = ([(1, KIND_MESSAGES, i) for i in range(40)] + [(2, KIND_NOOP, None),
           (2, KIND_CONTROL, None)] + [(2, KIND_MESSAGES, i) for i in range(40, 70)])
LAST = len(ENTRIES)
COMMIT = LAST - 3  # the hardstate commit is lazy: the last entries are not yet known committed


def write_replica(data_dir: str) -> None:
    """One replica written by the product: log, Raft index, hardstate, ConsumeQueues."""
    log = CommitLog.open(data_dir, CONFIG)
    for term, kind, i in ENTRIES:
        if kind == KIND_MESSAGES:
            body = encode_messages(_batch(i), CONFIG.message_size_bytes_max)
        elif kind == KIND_CONTROL:
            body = b"\x81\xa2op\xa6create"
        else:
            body = b""
        log.append(log.build_entries(term, [(kind, body)]))
    store = ConsumeQueueStore.open(data_dir, log, units_per_file=UNITS_PER_FILE)
    store.dispatch_committed(COMMIT)
    store.checkpoint()
    log.save_hard_state(HardState(2, 1, COMMIT))
    store.close()
    log.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    """ROOT/clean/<node>/ written by the product, and ROOT/damaged/ a damaged copy."""
    root = tmp_path_factory.mktemp("product")
    for n in NODES:
        write_replica(str(root / "clean" / n))
        shutil.copytree(root / "clean" / n, root / "damaged" / n)
    damage(str(root / "damaged"))
    return str(root)


def segments(data_dir: str) -> list[str]:
    d = os.path.join(data_dir, "commitlog")
    return [os.path.join(d, f) for f in sorted(os.listdir(d))]


def entry_at(data_dir: str, index: int) -> tuple[str, int]:
    """(segment path, file offset) of entry ``index``, found with the audit's parser."""
    for path in segments(data_dir):
        with open(path, "rb") as f:
            scan = parse.scan_segment(f.read(), int(os.path.basename(path)))
        hit = np.nonzero(scan.entries["index"] == index)[0]
        if len(hit):
            return path, int(scan.entries["file_offset"][hit[0]])
    raise AssertionError(f"entry {index} not found")


def damage(group: str) -> None:
    """n1: a ConsumeQueue unit points one byte past its message; n2: a body byte
    flipped in entry 20; n3: its last segment cut inside entry LAST - 5 although
    its checkpoint says everything is durable."""
    q = os.path.join(group, "n1", "consumequeue", "orders", "1")
    with open(os.path.join(q, sorted(os.listdir(q))[0]), "r+b") as f:
        f.seek(3 * 20)
        (offset,) = struct.unpack("<Q", f.read(8))
        f.seek(3 * 20)
        f.write(struct.pack("<Q", offset + 1))
    path, off = entry_at(os.path.join(group, "n2"), 20)
    with open(path, "r+b") as f:
        f.seek(off + 48 + 150)
        b = f.read(1)
        f.seek(off + 48 + 150)
        f.write(bytes([b[0] ^ 0x40]))
    path, off = entry_at(os.path.join(group, "n3"), LAST - 5)
    with open(path, "r+b") as f:
        f.truncate(off + 100)
    for later in segments(os.path.join(group, "n3")):
        if later > path:
            os.remove(later)


def violations(res) -> set[tuple[str, str, str, str]]:
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    groups = {st.gid: st.name for st in res.groups.values()}
    return {(groups[r["gid"]], r["check"], r["kind"], names.get((r["gid"], r["rid"]), ""))
            for r in res.findings.to_pylist() if r["severity"] == "violation"}


EXPECTED_DAMAGE = {
    ("damaged", "corruption", "body_crc", "n2"),
    ("damaged", "index_validity", "cq_dangling", "n1"),
    # ... and the message it used to index now has no unit on n1.
    ("damaged", "index_validity", "cq_not_indexed", "n1"),
    # n1's rewritten slot no longer names the message n2 and n3 index there.
    ("damaged", "duplicates", "cq_slot_conflict", ""),
    # The cut is before n3's durable point: a violation, not a crash's torn tail.
    ("damaged", "corruption", "torn_tail", "n3"),
    ("damaged", "lost_offsets", "durable_entries_missing", "n3"),
    ("damaged", "lost_offsets", "committed_entries_missing", "n3"),
    # n3's ConsumeQueues still index messages of the entries it lost.
    ("damaged", "index_validity", "cq_dangling", "n3"),
}


def test_audit_decodes_exactly_what_the_product_wrote(written):
    """Entry headers and message records as the audit parses them = as the product reads them."""
    data_dir = os.path.join(written, "clean", "n1")
    log = CommitLog.open(data_dir, CONFIG)
    try:
        product = log.read_entries(1, LAST + 1)
        got_entries, got_msgs, topics = [], [], []
        for path in segments(data_dir):
            with open(path, "rb") as f:
                buf = f.read()
            base = int(os.path.basename(path))
            scan = parse.scan_segment(buf, base)
            m = parse.parse_messages(buf, base, scan.entries)
            assert scan.problems == [] and m.problems == []
            got_entries += scan.entries.tolist()
            got_msgs += m.messages.tolist()
            topics += [m.topics[t] for t in m.messages["topic"]]
    finally:
        log.close()
    names = parse.ENTRY_DTYPE.names
    rows = [dict(zip(names, e, strict=True)) for e in got_entries]
    assert [(r["index"], r["term"], r["kind"], r["position"], r["size"]) for r in rows] == [
        (e.index, e.term, e.kind, e.position, 48 + len(e.body)) for e in product]
    want = []
    for e in product:
        if e.kind == KIND_MESSAGES:
            for s in decode_messages(e.body, e.position):
                want.append((e.index, s.physical_offset, s.size, s.message.topic,
                             s.message.queue_id, s.message.producer_id, s.message.sequence,
                             tag_hash(s.message.tags)))
    mnames = parse.MSG_DTYPE.names
    msgs = [dict(zip(mnames, m, strict=True)) for m in got_msgs]
    assert [(m["index"], m["phys_offset"], m["size"], t, m["queue_id"],
             m["producer_id"] & 0xFFFFFFFFFFFFFFFF, m["sequence"], m["tag_hash"])
            for m, t in zip(msgs, topics, strict=True)] == want
    assert len(want) == 4 * 70


def test_product_replicas_audit_clean_and_damage_is_caught(written):
    res = run_audit(AuditOptions([written]), LocalEngine())
    got = violations(res)
    assert {v for v in got if v[0] == "clean"} == set(), res.findings.to_pylist()
    assert {v for v in got if v[0] == "damaged"} == EXPECTED_DAMAGE
    clean = next(st for st in res.groups.values() if st.name == "clean")
    assert (clean.committed, clean.quorum_end) == (COMMIT, LAST)
    # Two groups of three replicas; damaged n3 lost six MESSAGES entries.
    assert res.counts["messages"] == 2 * 3 * 4 * 70 - 4 * 6
    # Clean group: one replica's records decoded; the damaged group also
    # decodes n2's corrupt entry 20 (its own bytes) and nothing else.
    assert res.counts["messages_decoded"] == 4 * 70 + 4 * 70 + 4
    rows = res.findings.to_pylist()
    (crc,) = [r for r in rows if r["kind"] == "body_crc"]
    path, off = entry_at(os.path.join(written, "damaged", "n2"), 20)
    assert (res.files[crc["fid"]].path, crc["file_offset"], crc["index"]) == (path, off, 20)
    (gap,) = [r for r in rows if r["kind"] == "committed_entries_missing"]
    assert (gap["index"], gap["count"]) == (LAST - 5, COMMIT - (LAST - 6))
    # The clean replicas' ConsumeQueues are byte-identical: validated once.
    shared = [r for r in rows if r["kind"] == "cq_same_as_reference"
              and res.groups[r["gid"]].name == "clean"]
    assert sorted(r["rid"] for r in shared) == [1, 2]
    # ... with the same findings as decoding and validating every replica alone.
    alone = run_audit(AuditOptions([written], share_identical=False), LocalEngine())
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
           "phys_offset", "count"]
    assert sorted((r for r in res.findings.select(key).to_pylist()
                   if r["kind"] != "cq_same_as_reference"), key=repr) == sorted(
        alone.findings.select(key).to_pylist(), key=repr)


@pytest.mark.spark
def test_spark_audits_product_files_like_the_local_engine(spark, written):
    from spark_audit.spark_engine import SparkEngine

    opts = AuditOptions([written])
    res = run_audit(opts, SparkEngine(spark))
    got = violations(res)
    assert {v for v in got if v[0] == "clean"} == set()
    assert {v for v in got if v[0] == "damaged"} == EXPECTED_DAMAGE
    local = run_audit(opts, LocalEngine())
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
           "phys_offset", "count"]
    assert sorted(res.findings.select(key).to_pylist(), key=repr) == sorted(
        local.findings.select(key).to_pylist(), key=repr)


def test_the_distributed_audit_reads_product_files_the_same(written):
    from spark_audit.engine import LocalFlowEngine

    opts = AuditOptions([written])
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "topic",
           "queue_id", "slot", "phys_offset", "count", "detail"]
    a, b = run_audit(opts, LocalEngine()), run_audit(opts, LocalFlowEngine())
    assert sorted(a.findings.select(key).to_pylist(), key=repr) == sorted(
        b.findings.select(key).to_pylist(), key=repr)
    # The clean group's identical replicas share the reference's records.
    assert b.counts["messages"] == a.counts["messages"]
    assert b.counts["messages_decoded"] < b.counts["messages"]
