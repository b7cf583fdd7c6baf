"""State snapshots: written atomically, verified on every read, pruned, adopted
from an install, and never trusted when damaged or forged."""

from __future__ import annotations

import logging
import os
import struct

import pytest
from crc32c import crc32c
from storage_crash import crash_points
from storage_support import SMALL, fill

from commitlog import CommitLog, CorruptionError, FormatVersionError
from commitlog.snapshot import (
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


def _meta_path(data_dir: str, index: int) -> str:
    return os.path.join(snapshot_path(data_dir, index), "meta")


def _rewrite_meta(data_dir: str, directory_index: int, **changes: int) -> None:
    """Forge a meta field and recompute its CRC, so only semantic checks can catch it."""
    path = _meta_path(data_dir, directory_index)
    with open(path, "rb") as handle:
        raw = handle.read()
    names = ["magic", "version", "index", "term", "end", "created", "size", "crc", "reserved"]
    fields = dict(zip(names, struct.unpack_from("<IIQQQQQII", raw), strict=True))
    fields.update(changes)
    head = struct.pack("<IIQQQQQII", *fields.values())
    with open(path, "wb") as handle:
        handle.write(head + struct.pack("<I", crc32c(head)))


def test_write_then_read_back(data_dir: str) -> None:
    info = write_snapshot(data_dir, 40, 3, 12_345, b"state at 40", created_ms=7)
    assert info == SnapshotInfo(40, 3, 12_345, 7, 11, crc32c(b"state at 40"),
                                snapshot_path(data_dir, 40))
    assert info.path == os.path.join(data_dir, "snapshots", f"{40:020d}")
    assert sorted(os.listdir(info.path)) == ["meta", "state"]
    assert os.path.getsize(_meta_path(data_dir, 40)) == META_SIZE == 60
    assert latest_snapshot(data_dir) == info
    assert list_snapshots(data_dir) == [info]
    assert read_meta(info.path) == info
    assert read_state(info) == b"state at 40"


def test_no_snapshot_yet(data_dir: str) -> None:
    assert latest_snapshot(data_dir) is None
    assert list_snapshots(data_dir) == []


def test_older_snapshots_are_pruned_to_keep(data_dir: str) -> None:
    for index in (10, 20, 30, 40):
        write_snapshot(data_dir, index, 1, index * 100, b"s%d" % index)
    assert [s.index for s in list_snapshots(data_dir)] == [30, 40]
    write_snapshot(data_dir, 50, 2, 5000, b"s50", keep=1)
    assert [s.index for s in list_snapshots(data_dir)] == [50]
    assert os.listdir(os.path.join(data_dir, "snapshots")) == [f"{50:020d}"]


def test_the_same_snapshot_twice_is_kept_and_a_different_one_replaces_it(data_dir: str) -> None:
    first = write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=1)
    assert write_snapshot(data_dir, 10, 1, 900, b"abc", created_ms=2) == first
    second = write_snapshot(data_dir, 10, 1, 900, b"abcd", created_ms=3)
    assert second.created_ms == 3 and read_state(second) == b"abcd"
    assert latest_snapshot(data_dir) == second


def test_a_state_with_a_bad_crc_is_skipped_and_refused(data_dir: str, caplog) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older state")
    newer = write_snapshot(data_dir, 20, 1, 1900, b"newer state")
    with open(newer.state_path, "r+b") as handle:
        handle.seek(3)
        handle.write(b"X")  # same size, different bytes: only the CRC can tell
    with caplog.at_level(logging.WARNING, logger="commitlog.snapshot"):
        assert latest_snapshot(data_dir) == older
    assert "state CRC" in caplog.text and newer.path in caplog.text
    with pytest.raises(CorruptionError, match="state CRC mismatch"):
        read_state(newer)
    assert read_state(older) == b"older state"
    # Without the CRC pass (a quick listing) the size still matches.
    assert latest_snapshot(data_dir, verify_state=False) == newer
    assert [bad.path for bad in scan_snapshots(data_dir, verify_state=True).bad] == [newer.path]


def test_a_state_of_the_wrong_size_or_missing_is_skipped(data_dir: str) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older state")
    newer = write_snapshot(data_dir, 20, 1, 1900, b"newer state")
    with open(newer.state_path, "ab") as handle:
        handle.write(b"!")
    assert latest_snapshot(data_dir, verify_state=False) == older
    with pytest.raises(CorruptionError, match="12 bytes, meta says 11"):
        read_state(newer)
    os.remove(newer.state_path)
    assert list_snapshots(data_dir) == [older]
    with pytest.raises(CorruptionError, match="missing"):
        read_state(newer)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing"])
def test_a_damaged_meta_is_skipped(data_dir: str, damage: str) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older")
    newer = write_snapshot(data_dir, 20, 1, 1900, b"newer")
    path = _meta_path(data_dir, 20)
    if damage == "truncated":
        os.truncate(path, META_SIZE - 1)
    elif damage == "flipped":
        with open(path, "r+b") as handle:
            handle.seek(17)
            handle.write(b"\x09")
    else:
        os.remove(path)
    assert latest_snapshot(data_dir) == older
    assert list_snapshots(data_dir) == [older]
    (bad,) = scan_snapshots(data_dir).bad
    assert bad.path == newer.path
    with pytest.raises(CorruptionError):
        read_meta(newer.path)


def test_a_forged_index_or_version_is_refused(data_dir: str) -> None:
    older = write_snapshot(data_dir, 10, 1, 900, b"older")
    write_snapshot(data_dir, 20, 1, 1900, b"newer")
    _rewrite_meta(data_dir, 20, index=25)  # a valid CRC over a meta in the wrong directory
    with pytest.raises(CorruptionError, match="meta says index 25"):
        read_meta(snapshot_path(data_dir, 20))
    assert latest_snapshot(data_dir) == older
    _rewrite_meta(data_dir, 20, index=20, version=3)
    with pytest.raises(FormatVersionError, match="unsupported format version 3"):
        read_meta(snapshot_path(data_dir, 20))
    assert latest_snapshot(data_dir) == older
    _rewrite_meta(data_dir, 20, version=1, magic=0x12345678)
    with pytest.raises(CorruptionError, match="bad magic"):
        read_meta(snapshot_path(data_dir, 20))
    _rewrite_meta(data_dir, 20, magic=0x53514D4C, term=0)
    with pytest.raises(CorruptionError, match="impossible"):
        read_meta(snapshot_path(data_dir, 20))
    _rewrite_meta(data_dir, 20, term=1)
    assert latest_snapshot(data_dir).index == 20  # the forgeries undone: usable again


def test_bad_arguments_are_refused(data_dir: str) -> None:
    with pytest.raises(ValueError):
        write_snapshot(data_dir, 0, 1, 10, b"")
    with pytest.raises(ValueError):
        write_snapshot(data_dir, 1, 0, 10, b"")
    with pytest.raises(ValueError):
        write_snapshot(data_dir, 1, 1, 10, b"", keep=0)


def test_adopt_moves_a_received_state_in(data_dir: str) -> None:
    write_snapshot(data_dir, 5, 1, 500, b"mine")
    staged = os.path.join(data_dir, "install.tmp", "state")
    os.makedirs(os.path.dirname(staged))
    with open(staged, "wb") as handle:
        handle.write(b"the leader's state" * 1000)
    info = adopt_snapshot(data_dir, staged, 300, 4, 77_000, created_ms=9)
    assert not os.path.exists(staged)
    assert (info.index, info.term, info.end_position, info.created_ms) == (300, 4, 77_000, 9)
    assert latest_snapshot(data_dir) == info
    assert read_state(info) == b"the leader's state" * 1000
    assert [s.index for s in list_snapshots(data_dir)] == [5, 300]


def test_the_data_directory_knows_the_snapshot_and_install_names(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 3)
    write_snapshot(data_dir, 3, 1, 1000, b"s")
    os.makedirs(os.path.join(data_dir, "install.tmp", "commitlog"))
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.recovery.foreign_files == []


def test_a_crash_at_any_point_of_a_write_leaves_the_old_or_the_new_snapshot() -> None:
    node = "/node"

    def setup(_fs: object) -> None:
        write_snapshot(node, 10, 1, 900, b"old" * 5000)
        write_snapshot(node, 20, 1, 1900, b"older still kept")

    def action(_fs: object) -> None:
        write_snapshot(node, 30, 2, 2900, b"new" * 5000, keep=2)

    def check(_fs: object, completed: bool) -> None:
        latest = latest_snapshot(node)
        assert latest is not None
        assert latest.index in (20, 30)
        if completed:
            assert latest.index == 30
        expected = b"new" * 5000 if latest.index == 30 else b"older still kept"
        assert read_state(latest) == expected
        # The next write is not disturbed by whatever the crash left.
        write_snapshot(node, 40, 2, 3900, b"next", keep=2)
        assert [s.index for s in list_snapshots(node)][-1] == 40
        assert len(list_snapshots(node)) == 2

    points = crash_points(node, setup, action, check)
    assert points > 5


def test_a_crash_during_adopt_leaves_the_old_snapshot_or_the_adopted_one() -> None:
    node = "/node"
    staged = "/node/install.tmp/state"

    def setup(_fs: object) -> None:
        from commitlog import fileio
        from commitlog.disk import atomic_replace

        write_snapshot(node, 10, 1, 900, b"mine")
        fileio.fs.makedirs("/node/install.tmp", exist_ok=True)
        atomic_replace(staged, b"theirs" * 3000)

    def action(_fs: object) -> None:
        adopt_snapshot(node, staged, 500, 3, 50_000)

    def check(_fs: object, completed: bool) -> None:
        latest = latest_snapshot(node)
        assert latest is not None and latest.index in (10, 500)
        assert not completed or latest.index == 500
        assert read_state(latest) == (b"theirs" * 3000 if latest.index == 500 else b"mine")

    crash_points(node, setup, action, check)
