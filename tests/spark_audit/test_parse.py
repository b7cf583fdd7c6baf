"""The format parsers on their own: small files, segments, index and ConsumeQueue files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from spark_audit import fmt, inputs, parse

from . import scenarios
from .replica_builder import Msg, encode_entry, make_log, write_replica

IDS = parse.FileId(0, 0, 0)


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


def test_segment_messages_match_what_was_written(tmp_path):
    lay = write_replica(str(tmp_path / "r"), make_log(scenarios.batches(40, per_entry=5)),
                        segment_size=8192)
    seen = []
    for start in sorted({p.segment for p in lay.entries}):
        with open(lay.segment_path(start), "rb") as f:
            r = parse.parse_segment(f.read(), start, IDS)
        assert r.problems.num_rows == 0
        seen.append(r)
    entries = [row for r in seen for row in r.entries.to_pylist()]
    assert [(e["index"], e["position"], e["size"], e["body_crc"]) for e in entries] == [
        (p.index, p.position, p.size, p.body_crc) for p in lay.entries]
    msgs = [row for r in seen for row in r.messages.to_pylist()]
    want = [(p.index, *m) for p in lay.entries for m in p.messages]
    assert [(m["index"], m["topic"], m["queue_id"], m["phys_offset"], m["msg_size"],
             m["tag_hash"]) for m in msgs] == want
    # u64 producer ids are kept as the int64 with the same bits (Spark has no u64).
    assert msgs[0]["producer_id"] == 0xABCDEF0123456789 - (1 << 64)
    assert [m["sequence"] for m in msgs] == list(range(200))


def test_malformed_record_inside_a_valid_entry_is_reported():
    from .replica_builder import encode_message

    rec = bytearray(encode_message(Msg("t", 1, b"body")))
    rec[0] += 3  # record size no longer matches its field lengths (and overruns)
    seg = encode_entry(1, 1, fmt.KIND_MESSAGES, 0, bytes(rec))
    r = parse.parse_segment(seg, 0, IDS)
    assert r.entries.num_rows == 1 and r.messages.num_rows == 0
    assert r.problems.column("problem").to_pylist() == ["bad_message"]


def test_garbage_between_entries_is_skipped_by_resync():
    a = encode_entry(1, 1, fmt.KIND_NOOP, 0, b"")
    junk = b"LMQE" + b"\x07" * 60
    b = encode_entry(2, 1, fmt.KIND_NOOP, len(a) + len(junk), b"")
    r = parse.parse_segment(a + junk + b, 0, IDS)
    assert r.entries.column("index").to_pylist() == [1, 2]
    assert r.problems.column("problem").to_pylist() == ["header_crc"]


def test_gather_binary_and_tag_hashes():
    a = np.frombuffer(b"xxabcyyTAGzz", np.uint8)
    arr = parse.gather_binary(a, np.array([2, 7, 0]), np.array([3, 3, 0]))
    assert arr.to_pylist() == [b"abc", b"TAG", b""]
    assert parse.tag_hashes(arr).tolist() == [fmt.crc(b"abc"), fmt.crc(b"TAG"), 0]


def test_index_and_cq_files_skip_empty_slots():
    rec = fmt.INDEX_RECORD.pack(48, 2, 100, 1, 77)
    rec += fmt.crc(rec).to_bytes(4, "little")
    t, p = parse.parse_index_file(b"\x00" * 32 + rec + b"\x01", 11, IDS)
    assert t.column("index").to_pylist() == [12] and t.column("rec_ok").to_pylist() == [True]
    assert p.column("problem").to_pylist() == ["index_partial_record"]
    units = b"\x00" * 20 + fmt.CQ_UNIT.pack(96, 80, 5)
    t, p = parse.parse_cq_file(units, "t", 3, 600, IDS)
    assert t.column("slot").to_pylist() == [601] and p.num_rows == 0


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
