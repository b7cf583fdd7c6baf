"""CommitLog.install: a snapshot install replaces every segment with the
leader's, verified first, crash-safe through the INSTALL marker; and the
sizes retention reads (disk_bytes, segment_infos)."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

import pytest
from crc32c import crc32c
from storage_crash import crash_points
from storage_support import SMALL, fill

from commitlog import (
    KIND_NOOP,
    CommitLog,
    CorruptionError,
    Entry,
    FormatVersionError,
    StorageError,
    fileio,
)
from commitlog import install as install_module
from commitlog.checkpoint import read_checkpoint
from commitlog.disk import atomic_replace
from commitlog.file_queue import file_name


@dataclass
class Staged:
    """What a leader streams for an install: its segments up to a snapshot's end."""

    directory: str
    first_index: int
    last_index: int
    last_term: int
    end: int
    entries: list[Entry]  # the leader's entries first_index..last_index


def _leader(data_dir: str) -> CommitLog:
    """A leader with 60 entries over three terms whose first segments retention removed."""
    log = CommitLog.open(data_dir, SMALL)
    for term in (1, 2, 3):
        fill(log, 20, term=term)
    log.flush()
    assert log.delete_before(log.segments.bases[2]) == 2
    assert log.first_index > 1
    return log


def _stage(leader: CommitLog, upto: int, node: str) -> Staged:
    """Copy the leader's segments holding [first_index, upto] into
    `<node>/install.tmp/commitlog`, the last one cut at upto's end."""
    directory = os.path.join(node, "install.tmp", "commitlog")
    fileio.fs.makedirs(directory, exist_ok=True)
    end = leader.entry_end(upto)
    for base in leader.segments.bases:
        if base >= end:
            break
        length = min(leader.segments.lengths[base], end - base)
        atomic_replace(os.path.join(directory, file_name(base)),
                       leader.segments.read(base, length))
    return Staged(directory, leader.first_index, upto, leader.term_at(upto), end,
                  leader.read_entries(leader.first_index, upto + 1))


def _follower(node: str) -> CommitLog:
    log = CommitLog.open(node, SMALL)
    fill(log, 8, term=1)
    log.flush()
    log.checkpoint()  # index files on disk too
    return log


def _install(log: CommitLog, staged: Staged) -> None:
    log.install(staged.directory, staged.first_index, staged.last_index, staged.last_term,
                staged.end)


def _file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _diverged_follower(node: str) -> CommitLog:
    """A follower whose log is longer than the install's first index and
    differs from the leader's (other sizes, so other positions)."""
    log = CommitLog.open(node, SMALL)
    fill(log, 100, term=1, size=250)
    log.flush()
    log.checkpoint()
    return log


@pytest.mark.parametrize("make_follower", [_follower, _diverged_follower])
def test_install_replaces_the_log_with_the_leaders_segments(tmp_path, make_follower) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = make_follower(node)
    old_bases = list(follower.segments.bases)
    staged = _stage(leader, 50, node)
    assert make_follower is _follower or (
        follower.last_index > staged.first_index and old_bases[-1] > staged.end)
    _install(follower, staged)
    assert (follower.first_index, follower.last_index, follower.last_term, follower.end) == (
        staged.first_index, 50, 3, staged.end)
    assert follower.durable_index == 50
    assert follower.read_entries(staged.first_index, 51) == staged.entries
    with pytest.raises(IndexError):
        follower.read_entry(staged.first_index - 1)
    assert os.listdir(staged.directory) == []  # moved, not copied
    assert not os.path.exists(os.path.join(node, "INSTALL"))
    checkpoint = read_checkpoint(node)
    assert (checkpoint.first_index, checkpoint.durable_index, checkpoint.durable_end,
            checkpoint.durable_term) == (staged.first_index, 50, staged.end, 3)
    # Replication continues from there: the leader's next entries, byte-identical files.
    follower.append(leader.read_entries(51, 61))
    follower.flush()
    assert follower.segments.bases == leader.segments.bases
    for base in leader.segments.bases:
        assert _file(follower.segments.path(base)) == _file(leader.segments.path(base))
    # Index files: none below the first index's file, none from the old log.
    index_files = sorted(int(n) for n in os.listdir(os.path.join(node, "index")))
    assert index_files[0] == follower.index.files.base_of(staged.first_index)
    assert follower.read_entries(staged.first_index, 61) == leader.read_entries(
        staged.first_index, 61)
    follower.close()
    with CommitLog.open(node, SMALL) as reopened:
        assert (reopened.first_index, reopened.last_index) == (staged.first_index, 60)
        assert reopened.recovery.cuts == [] and reopened.recovery.foreign_files == []
        assert reopened.read_entries(staged.first_index, 61) == leader.read_entries(
            staged.first_index, 61)
    leader.close()


def test_install_into_an_empty_log_and_then_truncate_and_retention(tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    log = CommitLog.open(node, SMALL)
    staged = _stage(leader, 60, node)
    _install(log, staged)
    assert log.last_index == 60
    log.truncate_after(55)  # conflict repair still works above the new first index
    assert log.last_index == 55
    log.append(log.build_entries(4, [(KIND_NOOP, b"")]))
    log.flush()
    first = log.first_index
    assert log.delete_before(log.segments.bases[1]) == 1
    assert log.first_index > first
    log.close()
    with CommitLog.open(node, SMALL) as reopened:
        assert reopened.last_index == 56 and reopened.term_at(56) == 4
    leader.close()


def _corrupt_body(staged: Staged) -> None:
    entry = staged.entries[len(staged.entries) // 2]
    base = entry.position - entry.position % SMALL.segment_size_bytes
    with open(os.path.join(staged.directory, file_name(base)), "r+b") as handle:
        handle.seek(entry.position - base + 60)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x40]))


def _drop_middle_segment(staged: Staged) -> None:
    names = sorted(os.listdir(staged.directory))
    os.remove(os.path.join(staged.directory, names[1]))


def _cut_last_segment(staged: Staged) -> None:
    path = os.path.join(staged.directory, sorted(os.listdir(staged.directory))[-1])
    os.truncate(path, os.path.getsize(path) - 5)


def _extend_last_segment(staged: Staged) -> None:
    with open(os.path.join(staged.directory, sorted(os.listdir(staged.directory))[-1]),
              "ab") as handle:
        handle.write(b"\x00" * 10)


@pytest.mark.parametrize(("damage", "message"), [
    (_corrupt_body, "body CRC mismatch"),
    (_drop_middle_segment, "does not follow"),
    (_cut_last_segment, "runs past the file end|truncated entry header"),
    (_extend_last_segment, "truncated entry header|bad magic"),
])
def test_a_damaged_staged_log_is_refused_and_nothing_changes(tmp_path, damage, message) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = _follower(node)
    before = follower.read_entries(1, 9)
    files = {name: _file(os.path.join(node, "commitlog", name))
             for name in os.listdir(os.path.join(node, "commitlog"))}
    staged = _stage(leader, 50, node)
    damage(staged)
    with pytest.raises(CorruptionError, match=message):
        _install(follower, staged)
    assert follower.failed is None
    assert (follower.first_index, follower.last_index) == (1, 8)
    assert follower.read_entries(1, 9) == before
    assert {name: _file(os.path.join(node, "commitlog", name))
            for name in os.listdir(os.path.join(node, "commitlog"))} == files
    assert not os.path.exists(os.path.join(node, "INSTALL"))
    fill(follower, 1)  # still a working log
    follower.close()
    leader.close()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("first_index", -1, "the first entry is index"),
    ("last_index", 49, "ends with index 50"),
    ("last_term", 2, "ends with index 50 \\(term 3\\)"),
    ("end", 1, "ends with index 50"),
])
def test_a_staged_log_that_is_not_what_the_install_names_is_refused(
        tmp_path, field: str, value: int, message: str) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = _follower(node)
    staged = _stage(leader, 50, node)
    args = {"first_index": staged.first_index, "last_index": 50, "last_term": 3,
            "end": staged.end}
    args[field] += value
    with pytest.raises(CorruptionError, match=message):
        follower.install(staged.directory, **args)
    assert follower.last_index == 8 and follower.failed is None
    follower.close()
    leader.close()


def test_bad_install_arguments_are_refused(tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = _follower(node)
    staged = _stage(leader, 50, node)
    with pytest.raises(ValueError, match="inside"):
        follower.install(str(tmp_path / "leader" / "commitlog"), staged.first_index, 50, 3,
                         staged.end)
    with pytest.raises(ValueError, match="cannot install"):
        follower.install(staged.directory, 0, 50, 3, staged.end)
    with open(os.path.join(staged.directory, "README"), "w") as handle:
        handle.write("x")
    with pytest.raises(ValueError, match="not a segment name"):
        _install(follower, staged)
    os.remove(os.path.join(staged.directory, "README"))
    empty = os.path.join(node, "install.tmp", "empty")
    os.makedirs(empty)
    with pytest.raises(CorruptionError, match="no segment staged"):
        follower.install(empty, staged.first_index, 50, 3, staged.end)
    assert follower.last_index == 8
    follower.close()
    leader.close()


def test_a_sync_or_checkpoint_captured_before_an_install_does_not_land_after_it(
        tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = _follower(node)
    fill(follower, 3)
    sync = follower.begin_sync()  # the Flusher's, to run on its thread
    checkpoint = follower.begin_checkpoint()
    staged = _stage(leader, 50, node)
    _install(follower, staged)
    follower.run_sync(sync)
    follower.finish_sync(sync)
    assert follower.durable_index == 50
    assert not follower.run_checkpoint(checkpoint)
    assert read_checkpoint(node).durable_index == 50
    assert follower.cut_since(sync.generation) is not None  # waiters learn of the cut
    follower.close()
    leader.close()


@pytest.mark.parametrize("step", ["move_in", "index", "finish"])
def test_an_install_cut_short_after_the_marker_is_finished_at_open(
        tmp_path, monkeypatch, step: str) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    follower = _follower(node)
    staged = _stage(leader, 50, node)

    def boom(*_args: object, **_kwargs: object) -> None:
        raise OSError("disk went away")

    if step == "move_in":
        monkeypatch.setattr(install_module, "move_in", boom)
    elif step == "index":
        monkeypatch.setattr("commitlog.log.IndexFiles.append", boom)
    else:
        monkeypatch.setattr(install_module, "finish", boom)
    with pytest.raises(OSError, match="disk went away"):
        _install(follower, staged)
    assert follower.failed is not None
    with pytest.raises(StorageError, match="failed earlier"):
        fill(follower, 1)
    follower.abandon()
    monkeypatch.undo()
    assert os.path.exists(os.path.join(node, "INSTALL"))
    with CommitLog.open(node, SMALL) as reopened:
        assert reopened.recovery.install_finished == (staged.first_index, 50)
        assert any("finished an interrupted snapshot install" in line
                   for line in reopened.recovery.lines())
        assert (reopened.first_index, reopened.last_index, reopened.end) == (
            staged.first_index, 50, staged.end)
        assert reopened.read_entries(staged.first_index, 51) == staged.entries
    assert not os.path.exists(os.path.join(node, "INSTALL"))
    leader.close()


def test_half_moved_segments_are_moved_the_rest_of_the_way(tmp_path) -> None:
    """The on-disk state of a crash in the middle of the moves, built by hand."""
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    _follower(node).close()
    staged = _stage(leader, 50, node)
    names = sorted(os.listdir(staged.directory))
    marker = install_module.InstallMarker(
        staged.first_index, 50, 3, staged.end, os.path.join("install.tmp", "commitlog"),
        tuple((int(n), os.path.getsize(os.path.join(staged.directory, n))) for n in names))
    install_module.write_marker(node, marker)
    os.replace(os.path.join(staged.directory, names[0]),
               os.path.join(node, "commitlog", names[0]))  # one moved, the rest not
    with CommitLog.open(node, SMALL) as log:
        assert log.recovery.install_finished == (staged.first_index, 50)
        assert log.recovery.index_rebuilt_from is not None or log.recovery.scan_from_index == \
            staged.first_index  # every installed entry verified again
        assert log.read_entries(staged.first_index, 51) == staged.entries
        assert sorted(os.listdir(os.path.join(node, "commitlog"))) == names
    leader.close()


def test_a_marker_naming_a_segment_that_is_nowhere_stops_the_open(tmp_path) -> None:
    leader = _leader(str(tmp_path / "leader"))
    node = str(tmp_path / "node")
    _follower(node).close()
    staged = _stage(leader, 50, node)
    names = sorted(os.listdir(staged.directory))
    marker = install_module.InstallMarker(
        staged.first_index, 50, 3, staged.end, os.path.join("install.tmp", "commitlog"),
        tuple((int(n), os.path.getsize(os.path.join(staged.directory, n))) for n in names))
    install_module.write_marker(node, marker)
    os.remove(os.path.join(staged.directory, names[-1]))
    with pytest.raises(CorruptionError, match="neither in commitlog/ nor staged"):
        CommitLog.open(node, SMALL)
    assert os.path.exists(os.path.join(node, "INSTALL"))  # kept for the operator
    leader.close()


def test_a_damaged_or_forged_marker_stops_the_open(tmp_path) -> None:
    node = str(tmp_path / "node")
    _follower(node).close()
    marker = install_module.InstallMarker(10, 20, 2, 9000, "install.tmp/commitlog",
                                          ((8192, 800),))
    raw = install_module.encode_marker(marker)
    path = os.path.join(node, "INSTALL")
    with open(path, "wb") as handle:
        handle.write(raw[:-7] + raw[-6:])  # one byte short
    with pytest.raises(CorruptionError, match="install marker"):
        CommitLog.open(node, SMALL)
    body = bytearray(raw[:-4])
    struct.pack_into("<I", body, 4, 2)  # version 2, CRC made to match
    with open(path, "wb") as handle:
        handle.write(bytes(body) + struct.pack("<I", crc32c(bytes(body))))
    with pytest.raises(FormatVersionError, match="version 2"):
        CommitLog.open(node, SMALL)
    assert install_module.read_marker(str(tmp_path)) is None


def test_a_crash_at_any_point_of_an_install_leaves_the_old_or_the_installed_log() -> None:
    node = "/node"
    boxes: dict[str, object] = {}

    def setup(_fs: object) -> None:
        leader = _leader("/leader")
        follower = _follower(node)
        boxes["old"] = follower.read_entries(1, 9)
        boxes["staged"] = _stage(leader, 50, node)
        boxes["follower"] = follower
        leader.abandon()

    def action(_fs: object) -> None:
        follower, staged = boxes["follower"], boxes["staged"]
        assert isinstance(follower, CommitLog) and isinstance(staged, Staged)
        _install(follower, staged)

    outcomes: set[str] = set()

    def check(_fs: object, completed: bool) -> None:
        staged = boxes["staged"]
        assert isinstance(staged, Staged)
        with CommitLog.open(node, SMALL) as log:
            if log.last_index == 8:
                assert not completed
                assert log.first_index == 1 and log.read_entries(1, 9) == boxes["old"]
                outcomes.add("old")
            else:
                assert (log.first_index, log.last_index, log.last_term, log.end) == (
                    staged.first_index, 50, 3, staged.end)
                assert log.read_entries(staged.first_index, 51) == staged.entries
                outcomes.add("rolled forward" if log.recovery.install_finished else "installed")
            assert not fileio.fs.read_file(os.path.join(node, "INSTALL"))
            fill(log, 2, term=5)  # and it takes appends

    points = crash_points(node, setup, action, check, seeds=2)
    assert points > 10
    assert outcomes == {"old", "rolled forward", "installed"}


def test_disk_bytes_counts_segments_and_index_files(tmp_path) -> None:
    node = str(tmp_path / "node")
    with CommitLog.open(node, SMALL) as log:
        fill(log, 40)
        log.flush()

        def on_disk() -> int:
            return sum(os.path.getsize(os.path.join(node, sub, name))
                       for sub in ("commitlog", "index")
                       for name in os.listdir(os.path.join(node, sub)))

        total = log.disk_bytes()
        assert total == on_disk() > 40 * 300
        log.delete_before(log.segments.bases[2])
        assert log.disk_bytes() == on_disk() < total


def test_segment_infos_name_each_segments_first_entry_and_age(tmp_path) -> None:
    node = str(tmp_path / "node")
    started = time.time() * 1000
    with CommitLog.open(node, SMALL) as log:
        fill(log, 40)
        log.flush()
        infos = log.segment_infos()
        assert [i.base for i in infos] == log.segments.bases
        for info in infos:
            assert info.length == os.path.getsize(log.segments.path(info.base))
            entry = log.read_entry(info.first_index)
            assert entry.position == info.base
            assert started - 2000 <= info.mtime_ms <= time.time() * 1000 + 2000
        assert infos[0].first_index == 1
        old = log.segments.path(infos[0].base)
        os.utime(old, (1_000_000, 1_000_000))
        assert log.segment_infos()[0].mtime_ms == 1_000_000_000
        log.delete_before(infos[2].base)
        assert log.segment_infos()[0] == infos[2]
