"""Snapshot meta version 2: the membership at the snapshot's index travels with
it (length-prefixed JSON under the CRC); version 1 metas still read (no
membership); damaged, truncated or forged version 2 metas are refused."""

from __future__ import annotations

import os
import struct

import pytest
from crc32c import crc32c
from storage_crash import crash_points

from commitlog import CorruptionError, FormatVersionError
from commitlog.snapshot import (
    MEMBERSHIP_BYTES_MAX,
    META_SIZE,
    SnapshotInfo,
    adopt_snapshot,
    latest_snapshot,
    list_snapshots,
    read_meta,
    read_state,
    scan_snapshots,
    snapshot_path,
    write_snapshot,
)
from dledger.membership import Member, Membership, add_learner, bootstrap, decode, encode

CONFIG = encode(bootstrap({1: "10.0.0.1:7001", 2: "10.0.0.2:7001", 3: "10.0.0.3:7001"}))
GROWN = encode(add_learner(decode(CONFIG), Member(4, "10.0.0.4:7001", 77)))
_HEAD = struct.Struct("<IIQQQQQII")


def _meta_path(data_dir: str, index: int) -> str:
    return os.path.join(snapshot_path(data_dir, index), "meta")


def _raw(data_dir: str, index: int) -> bytes:
    with open(_meta_path(data_dir, index), "rb") as handle:
        return handle.read()


def _put(data_dir: str, index: int, raw: bytes) -> None:
    with open(_meta_path(data_dir, index), "wb") as handle:
        handle.write(raw)


def _v2(index: int, term: int, end: int, state: bytes, membership: bytes,
        length: int | None = None, version: int = 2, created: int = 5) -> bytes:
    """A version-2 meta built by hand from docs/storage-format.md, CRC valid."""
    head = _HEAD.pack(0x53514D4C, version, index, term, end, created, len(state),
                      crc32c(state), 0)
    body = head + struct.pack("<I", len(membership) if length is None else length) + membership
    return body + struct.pack("<I", crc32c(body))


def test_the_membership_round_trips(data_dir: str) -> None:
    info = write_snapshot(data_dir, 40, 3, 12_345, b"state at 40", created_ms=7,
                          membership=CONFIG)
    assert info == SnapshotInfo(40, 3, 12_345, 7, 11, crc32c(b"state at 40"),
                                snapshot_path(data_dir, 40), CONFIG)
    raw = _raw(data_dir, 40)
    assert len(raw) == META_SIZE + 4 + len(CONFIG)
    assert raw == _v2(40, 3, 12_345, b"state at 40", CONFIG, created=7)
    assert read_meta(info.path) == info == latest_snapshot(data_dir)
    assert decode(latest_snapshot(data_dir).membership) == decode(CONFIG)


def test_without_a_membership_the_meta_stays_version_1(data_dir: str) -> None:
    """None (the bootstrap configuration) writes the 60-byte version 1 record:
    byte for byte what releases before membership changes wrote and read."""
    info = write_snapshot(data_dir, 10, 1, 900, b"s", created_ms=3)
    raw = _raw(data_dir, 10)
    head = _HEAD.pack(0x53514D4C, 1, 10, 1, 900, 3, 1, crc32c(b"s"), 0)
    assert raw == head + struct.pack("<I", crc32c(head))
    assert info.membership is None and read_meta(info.path) == info


def test_a_version_1_meta_written_by_hand_is_still_read(data_dir: str) -> None:
    write_snapshot(data_dir, 20, 2, 1900, b"old", membership=CONFIG)
    head = _HEAD.pack(0x53514D4C, 1, 20, 2, 1900, 1, 3, crc32c(b"old"), 0)
    _put(data_dir, 20, head + struct.pack("<I", crc32c(head)))
    info = latest_snapshot(data_dir)
    assert info is not None and (info.index, info.membership) == (20, None)
    assert read_state(info) == b"old"


def test_rewriting_with_another_membership_replaces_the_meta(data_dir: str) -> None:
    first = write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=1, membership=CONFIG)
    assert write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=2,
                          membership=CONFIG) == first
    second = write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=3, membership=GROWN)
    assert second.created_ms == 3 and latest_snapshot(data_dir) == second
    third = write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=4)
    assert third.membership is None and latest_snapshot(data_dir) == third


def test_adopt_keeps_the_leaders_membership(data_dir: str) -> None:
    staged = os.path.join(data_dir, "install.tmp", "state")
    os.makedirs(os.path.dirname(staged))
    with open(staged, "wb") as handle:
        handle.write(b"theirs")
    info = adopt_snapshot(data_dir, staged, 300, 4, 77_000, membership=GROWN)
    assert latest_snapshot(data_dir) == info and info.membership == GROWN


@pytest.mark.parametrize("cut", [1, 4, len(CONFIG), len(CONFIG) + 4, len(CONFIG) + 7])
def test_a_truncated_version_2_meta_is_refused(data_dir: str, cut: int) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older", membership=CONFIG)
    newer = write_snapshot(data_dir, 20, 1, 1900, b"newer", membership=GROWN)
    raw = _raw(data_dir, 20)
    _put(data_dir, 20, raw[:-cut])
    with pytest.raises(CorruptionError):
        read_meta(newer.path)
    assert latest_snapshot(data_dir) == older
    assert [b.path for b in scan_snapshots(data_dir).bad] == [newer.path]


@pytest.mark.parametrize("at", [8, 56, 60, 75, -1])
def test_a_flipped_bit_anywhere_in_a_version_2_meta_is_refused(data_dir: str, at: int) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older")
    write_snapshot(data_dir, 20, 1, 1900, b"newer", membership=GROWN)
    raw = bytearray(_raw(data_dir, 20))
    raw[at] ^= 0x10
    _put(data_dir, 20, bytes(raw))
    with pytest.raises(CorruptionError):
        read_meta(snapshot_path(data_dir, 20))
    assert latest_snapshot(data_dir) == older


@pytest.mark.parametrize(("membership", "length", "match"), [
    (b"", 0, "membership length 0"),
    (b"{}", MEMBERSHIP_BYTES_MAX + 1, "membership length"),
    (b"{}", 2**32 - 1, "membership length"),
    (b"{}", 1, "bytes expected"),   # the length says less than the file holds
    (b"{}", 3, "bytes expected"),   # or more
    (b"not json", None, "not JSON"),
    (b"[" * 100_000, None, "not JSON"),  # nesting deeper than the parser goes
    (b"[1, 2]", None, "not a JSON object"),
    (b"\xff\xfe{", None, "not JSON"),
])
def test_a_forged_version_2_meta_with_a_valid_crc_is_refused(
        data_dir: str, membership: bytes, length: int | None, match: str) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older")
    write_snapshot(data_dir, 20, 1, 1900, b"newer")
    _put(data_dir, 20, _v2(20, 1, 1900, b"newer", membership, length))
    with pytest.raises(CorruptionError, match=match) as caught:
        read_meta(snapshot_path(data_dir, 20))
    assert _meta_path(data_dir, 20) in str(caught.value)
    assert latest_snapshot(data_dir) == older


def test_an_unknown_version_is_refused_naming_the_file(data_dir: str) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older")
    write_snapshot(data_dir, 20, 1, 1900, b"newer")
    _put(data_dir, 20, _v2(20, 1, 1900, b"newer", CONFIG, version=3))
    with pytest.raises(FormatVersionError, match="unsupported format version 3") as caught:
        read_meta(snapshot_path(data_dir, 20))
    assert _meta_path(data_dir, 20) in str(caught.value)
    assert latest_snapshot(data_dir) == older
    (bad,) = scan_snapshots(data_dir).bad
    assert "version 3" in bad.reason


def test_a_membership_that_could_not_be_read_back_is_not_written(data_dir: str) -> None:
    for bad in (b"", b"[]", b"nope", b"{" + b" " * MEMBERSHIP_BYTES_MAX + b"}"):
        with pytest.raises(ValueError, match="membership"):
            write_snapshot(data_dir, 10, 1, 900, b"s", membership=bad)
    assert list_snapshots(data_dir) == []


def test_a_crash_at_any_point_of_a_version_2_write_leaves_old_or_new() -> None:
    node = "/node"
    learners = Membership(decode(CONFIG).voters, (Member(9, "h:1", 5),))

    def setup(_fs: object) -> None:
        write_snapshot(node, 10, 1, 900, b"old", membership=CONFIG)

    def action(_fs: object) -> None:
        write_snapshot(node, 30, 2, 2900, b"new" * 2000, membership=encode(learners))

    def check(_fs: object, completed: bool) -> None:
        latest = latest_snapshot(node)
        assert latest is not None and latest.index in (10, 30)
        assert not completed or latest.index == 30
        want = encode(learners) if latest.index == 30 else CONFIG
        assert latest.membership == want

    assert crash_points(node, setup, action, check) > 5
