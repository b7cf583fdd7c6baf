"""The format parsers on their own: small files, segments, index and ConsumeQueue files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from spark_audit import fmt, inputs, parse

from . import scenarios
from .replica_builder import Msg, encode_entry, make_log, write_replica


def test_crc_is_crc32c():
    assert fmt.crc(b"123456789") == 0xE3069283
    assert fmt.ENTRY_MAGIC_BYTES == b"LMQE"


def test_small_files_round_trip_and_reject_damage():
    cp = fmt.Checkpoint(10, 4096, 3, 1)
    assert fmt.parse_checkpoint(fmt.encode_checkpoint(cp)) == cp
    hs = fmt.HardState(5, 2, 9)
    raw = fmt.encode_hardstate(hs)
    assert fmt.parse_hardstate(raw) == hs
    with pytest.raises(fmt.FormatError, match="CRC"):
        fmt.parse_hardstate(raw[:20] + b"\x01" + raw[21:])
    dc = fmt.DispatchCheckpoint(7, 999, (("t", 0, 4),))
    assert fmt.parse_dispatch_checkpoint(fmt.encode_dispatch_checkpoint(dc)) == dc
    bad = bytearray(fmt.encode_checkpoint(cp))
    bad[4] = 2
    with pytest.raises(fmt.FormatError, match="version"):
        fmt.parse_checkpoint(bytes(bad))


def test_snapshot_meta_round_trips_and_rejects_damage():
    meta = fmt.SnapshotMeta(120, 3, 65536, 1_700_000_000_000, 42, 0xDEADBEEF)
    raw = fmt.encode_snapshot_meta(meta)
    assert raw[:4] == b"LMQS" and len(raw) == fmt.SNAPSHOT_META_SIZE
    assert fmt.parse_snapshot_meta(raw) == meta
    for at, match in ((9, "CRC"), (0, "magic")):
        bad = bytearray(raw)
        bad[at] ^= 1
        with pytest.raises(fmt.FormatError, match=match):
            fmt.parse_snapshot_meta(bytes(bad))
    with pytest.raises(fmt.FormatError, match="bytes"):
        fmt.parse_snapshot_meta(raw[:-1])
    huge = fmt.encode_snapshot_meta(fmt.SnapshotMeta(1 << 63, 1, 1, 0, 0, 0))
    with pytest.raises(fmt.ImplausibleValue, match="index"):
        fmt.parse_snapshot_meta(huge)
    zero = fmt.encode_snapshot_meta(fmt.SnapshotMeta(5, 0, 100, 0, 0, 0))
    with pytest.raises(fmt.ImplausibleValue, match="at least 1"):
        fmt.parse_snapshot_meta(zero)


_MEMBERSHIP = (b'{"learners":[{"address":"h4:1","directory_id":9,"node_id":4}],"v":1,'
               b'"voters":[{"address":"h1:1","directory_id":0,"node_id":1},'
               b'{"address":"h2:1","directory_id":7,"node_id":2}]}')


def _v2_meta(membership: bytes, length: int | None = None) -> bytes:
    """A version 2 meta built from the format page, CRC valid."""
    head = fmt.SNAPSHOT_META.pack(fmt.SNAPSHOT_MAGIC, 2, 120, 3, 65536, 1, 42, 7, 0)
    head += (len(membership) if length is None else length).to_bytes(4, "little") + membership
    return head + fmt.crc(head).to_bytes(4, "little")


def test_snapshot_meta_version_2_carries_the_membership():
    meta = fmt.SnapshotMeta(120, 3, 65536, 1, 42, 7, _MEMBERSHIP)
    raw = fmt.encode_snapshot_meta(meta)
    assert raw == _v2_meta(_MEMBERSHIP) and len(raw) == 64 + len(_MEMBERSHIP)
    assert fmt.parse_snapshot_meta(raw) == meta
    # Version 1 (no membership) still parses, as None.
    v1 = fmt.encode_snapshot_meta(fmt.SnapshotMeta(120, 3, 65536, 1, 42, 7))
    assert v1[4] == 1 and fmt.parse_snapshot_meta(v1).membership is None
    for cut in (1, 4, len(_MEMBERSHIP), len(raw) - 60):
        with pytest.raises(fmt.FormatError, match="bytes"):
            fmt.parse_snapshot_meta(raw[:-cut])
    for at in (8, 57, 70, len(raw) - 1):
        bad = bytearray(raw)
        bad[at] ^= 4
        with pytest.raises(fmt.FormatError):
            fmt.parse_snapshot_meta(bytes(bad))
    future = bytearray(_v2_meta(_MEMBERSHIP))
    future[4] = 3
    with pytest.raises(fmt.FormatError, match="version 3 is not known"):
        fmt.parse_snapshot_meta(bytes(future))


@pytest.mark.parametrize(("membership", "length", "match"), [
    (b"", 0, "length 0"),
    (b"{}", 2**32 - 1, "length"),
    (b"{}", 5, "bytes, expected"),
    (b"nope", None, "not JSON"),
    (b"[" * 50_000, None, "not JSON"),
    (b'{"v":2,"voters":[],"learners":[]}', None, "no known version"),
    (b'{"v":1,"voters":[],"learners":[]}', None, "voter list"),
    (b'{"v":1,"voters":[1],"learners":[]}', None, "not an object"),
    (b'{"v":1,"voters":[{"node_id":true,"address":"","directory_id":0}],"learners":[]}',
     None, "wrong types"),
    (b'{"v":1,"voters":[{"node_id":1,"address":"","directory_id":-1}],"learners":[]}',
     None, "directory_id"),
    (b'{"v":1,"voters":[{"node_id":1,"address":"","directory_id":0,"client_address":7}],'
     b'"learners":[]}', None, "wrong types"),
    (b'{"v":1,"voters":[{"node_id":1,"address":"","directory_id":' + b"9" * 30 + b'}],'
     b'"learners":[]}', None, "directory_id"),
    (b'{"v":1,"voters":[{"node_id":1,"address":"","directory_id":0}],'
     b'"learners":[{"node_id":1,"address":"","directory_id":0}]}', None, "twice"),
])
def test_snapshot_meta_version_2_refuses_a_bad_membership(membership, length, match):
    with pytest.raises(fmt.FormatError, match=match):
        fmt.parse_snapshot_meta(_v2_meta(membership, length))


def test_snapshot_files_are_classified_and_staging_is_skipped(tmp_path):
    scenarios.clean(str(tmp_path / "g"), 3)
    node = tmp_path / "g" / "n1"
    for rel in ("snapshots/00000000000000000002/meta", "snapshots/00000000000000000002/state",
                "snapshots/00000000000000000003.tmp/meta", "install.tmp/commitlog/"
                "00000000000000000000", "install.tmp/state", "INSTALL"):
        (node / rel).parent.mkdir(parents=True, exist_ok=True)
        (node / rel).write_bytes(b"x")
    reps = inputs.parse_group_specs([str(tmp_path / "g")])
    files = [f for f in inputs.inventory(reps) if f.rid == 0]
    got = {(f.kind, f.start) for f in files
           if f.kind in (inputs.SNAPSHOT_META, inputs.SNAPSHOT_STATE, inputs.INSTALL_MARKER)}
    assert got == {("snapshot_meta", 2), ("snapshot_state", 2), ("install", 0)}
    assert not [f for f in files if ".tmp" in f.path]


def _parse(buf: bytes, start: int = 0):
    scan = parse.scan_segment(buf, start)
    return scan, parse.parse_messages(buf, start, scan.entries)


def test_segment_messages_match_what_was_written(tmp_path):
    lay = write_replica(str(tmp_path / "r"), make_log(scenarios.batches(40, per_entry=5)),
                        segment_size=8192)
    entries, msgs, topics = [], [], []
    for start in sorted({p.segment for p in lay.entries}):
        with open(lay.segment_path(start), "rb") as f:
            scan, m = _parse(f.read(), start)
        assert scan.problems == [] and m.problems == []
        assert m.counts.tolist() == [5] * len(scan.entries)
        entries += scan.entries.tolist()
        msgs += m.messages.tolist()
        topics += [m.topics[t] for t in m.messages["topic"]]
    names = parse.ENTRY_DTYPE.names
    got = [dict(zip(names, e, strict=True)) for e in entries]
    assert [(e["index"], e["position"], e["size"], e["body_crc"], e["crc_ok"]) for e in got] == [
        (p.index, p.position, p.size, p.body_crc, True) for p in lay.entries]
    mnames = parse.MSG_DTYPE.names
    rows = [dict(zip(mnames, m, strict=True)) for m in msgs]
    want = [(p.index, *m) for p in lay.entries for m in p.messages]
    assert [(m["index"], t, m["queue_id"], m["phys_offset"], m["size"], m["tag_hash"])
            for m, t in zip(rows, topics, strict=True)] == want
    # u64 producer ids are kept as the int64 with the same bits (Spark has no u64).
    assert rows[0]["producer_id"] == 0xABCDEF0123456789 - (1 << 64)
    assert [m["sequence"] for m in rows] == list(range(200))


def test_only_the_given_entries_are_decoded(tmp_path):
    lay = write_replica(str(tmp_path / "r"), make_log(scenarios.batches(10, per_entry=3)))
    with open(lay.segment_path(0), "rb") as f:
        buf = f.read()
    scan = parse.scan_segment(buf, 0)
    some = scan.entries[[2, 7]]
    m = parse.parse_messages(buf, 0, some)
    assert m.counts.tolist() == [3, 3]
    assert sorted(set(m.messages["index"].tolist())) == [3, 8]
    assert m.messages["phys_offset"].tolist() == [off for i in (3, 8)
                                                  for _, _, off, _, _ in lay.entry(i).messages]


def test_malformed_record_inside_a_valid_entry_is_reported():
    from .replica_builder import encode_message

    rec = bytearray(encode_message(Msg("t", 1, b"body")))
    rec[0] += 3  # record size no longer matches its field lengths (and overruns)
    seg = encode_entry(1, 1, fmt.KIND_MESSAGES, 0, bytes(rec))
    scan, m = _parse(seg)
    assert len(scan.entries) == 1 and len(m.messages) == 0
    assert [(p[2], p[4]) for p in m.problems] == [("bad_message", 0)]


def test_body_crc_failure_keeps_the_entry_and_flags_it():
    seg = bytearray(encode_entry(1, 1, fmt.KIND_CONTROL, 0, b"payload"))
    seg[50] ^= 1
    scan = parse.scan_segment(bytes(seg), 0)
    assert scan.entries["crc_ok"].tolist() == [False]
    assert [p[2] for p in scan.problems] == ["body_crc"]


def test_garbage_between_entries_is_skipped_by_resync():
    a = encode_entry(1, 1, fmt.KIND_NOOP, 0, b"")
    junk = b"LMQE" + b"\x07" * 60
    b = encode_entry(2, 1, fmt.KIND_NOOP, len(a) + len(junk), b"")
    scan = parse.scan_segment(a + junk + b, 0)
    assert scan.entries["index"].tolist() == [1, 2]
    assert [p[2] for p in scan.problems] == ["header_crc"]


def test_gather_rows_binary_and_tag_hashes():
    a = np.frombuffer(b"xxabcyyTAGzz", np.uint8)
    assert parse.gather_rows(a, np.array([2, 7, 9]), 3).tobytes() == b"abcTAGGzz"
    arr = parse.gather_binary(a, np.array([2, 7, 0]), np.array([3, 3, 0]))
    assert arr.to_pylist() == [b"abc", b"TAG", b""]
    ids, values = parse.short_strings(a, np.array([2, 7, 2, 0]), np.array([3, 3, 3, 0]))
    assert [values[i] for i in ids] == [b"abc", b"TAG", b"abc", b""]


def test_long_topics_and_tags_take_the_variable_width_path():
    from .replica_builder import encode_message

    msgs = [Msg("t" * 120, 1, b"x", tags=b"T" * 300), Msg("orders", 2, b"y", tags=b"")]
    seg = encode_entry(1, 1, fmt.KIND_MESSAGES, 0, b"".join(encode_message(m) for m in msgs))
    scan, m = _parse(seg)
    assert scan.problems == [] and m.problems == []
    assert [m.topics[t] for t in m.messages["topic"]] == ["t" * 120, "orders"]
    assert m.messages["tag_hash"].tolist() == [fmt.crc(b"T" * 300), 0]
    assert m.messages["queue_id"].tolist() == [1, 2]


def test_index_and_cq_files_skip_empty_slots():
    rec = fmt.INDEX_RECORD.pack(48, 2, 100, 1, 77)
    rec += fmt.crc(rec).to_bytes(4, "little")
    t, p = parse.parse_index_file(b"\x00" * 32 + rec + b"\x01", 11)
    assert t["index"].tolist() == [12] and t["rec_ok"].tolist() == [True]
    assert [x[2] for x in p] == ["index_partial_record"]
    units = b"\x00" * 20 + fmt.CQ_UNIT.pack(96, 80, 5)
    t, p = parse.parse_cq_file(units, 600)
    assert t["slot"].tolist() == [601] and t["offset"].tolist() == [96] and p == []
    assert parse.cq_unit_count(units) == 1
    assert [x[2] for x in parse.parse_cq_file(units + b"\x01", 0)[1]] == ["cq_partial_unit"]


def test_group_specs_root_and_explicit(tmp_path):
    scenarios.clean(str(tmp_path / "root" / "g1"), 5)
    scenarios.clean(str(tmp_path / "root" / "g2"), 5)
    reps = inputs.parse_group_specs([str(tmp_path / "root")])
    assert [(r.group, r.name) for r in reps] == [(g, n) for g in ("g1", "g2")
                                                  for n in scenarios.NODES]
    one = inputs.parse_group_specs([str(tmp_path / "root" / "g2")])
    assert {r.group for r in one} == {"g2"}
    dirs = ",".join(str(tmp_path / "root" / "g1" / n) for n in scenarios.NODES)
    ex = inputs.parse_group_specs([f"east={dirs}"])
    assert [(r.gid, r.rid, r.group) for r in ex] == [(0, i, "east") for i in range(3)]
    files = inputs.inventory(ex)
    kinds = {f.kind for f in files}
    assert kinds == {"segment", "index", "cq", "checkpoint", "hardstate", "cq_checkpoint"}
    assert all(os.path.exists(f.path) for f in files)


def test_the_intact_fast_path_reads_what_the_careful_walk_reads(tmp_path, monkeypatch):
    """An intact segment is read with one loop step per entry and array checks; a
    damaged one by the careful walk. Both give the same rows and problems."""
    write_replica(str(tmp_path / "n1"), make_log(scenarios.batches(60)), segment_size=1 << 20)
    seg = tmp_path / "n1" / "commitlog"
    path = seg / sorted(os.listdir(seg))[0]
    intact = path.read_bytes()
    first = parse.scan_segment(intact, 0)
    second = first.entries[1]
    body = bytearray(intact)
    body[int(second["file_offset"]) + 60] ^= 1  # a body byte: fast path, crc_ok false
    head = bytearray(intact)
    head[int(second["file_offset"]) + 20] ^= 1  # a header byte: the careful walk
    cut = intact[:-7]  # a torn tail: the careful walk
    variants = {"intact": intact, "body": bytes(body), "head": bytes(head), "cut": cut}
    fast = {k: parse.scan_segment(v, 0) for k, v in variants.items()}
    monkeypatch.setattr(parse, "_scan_intact", lambda *a: None)
    for name, buf in variants.items():
        slow = parse.scan_segment(buf, 0)
        assert fast[name].entries.tolist() == slow.entries.tolist(), name
        assert fast[name].problems == slow.problems, name
        assert fast[name].valid_end == slow.valid_end, name
    assert [p[2] for p in fast["body"].problems] == ["body_crc"]
    assert not fast["body"].entries["crc_ok"][1] and fast["body"].entries["crc_ok"][0]
    assert fast["head"].problems and fast["cut"].problems
