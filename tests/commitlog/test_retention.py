"""CommitLog.delete_before (retention) under crashes: whole segments only,
never durable-unknown data, and a log whose first index moved reopens right
whatever step a crash interrupted."""

from __future__ import annotations

import os

import pytest
from storage_crash import crash_points
from storage_support import SMALL, fill

from commitlog import KIND_CONTROL, CommitLog, CommitLogConfig
from commitlog import log as log_module
from commitlog.checkpoint import read_checkpoint

S = SMALL.segment_size_bytes


def _index_files(node: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(node, "index")) if n.isdigit())


def _filled(node: str, count: int = 60) -> CommitLog:
    log = CommitLog.open(node, SMALL)
    fill(log, count)
    log.flush()
    log.checkpoint()
    return log


def test_first_index_moves_to_the_first_kept_segment_and_index_files_follow(tmp_path) -> None:
    node = str(tmp_path / "node")
    log = _filled(node)
    entries = log.read_entries(1, 61)
    assert log.delete_before(log.segments.bases[4] + 100) == 4
    first = log.first_index
    assert log.read_entry(first).position == log.segments.bases[0] == 4 * S
    assert first == next(e.index for e in entries if e.position == 4 * S)
    # Index files wholly below the first index are gone; the one holding it stays.
    assert _index_files(node)[0] == log.index.files.base_of(first)
    checkpoint = read_checkpoint(node)
    assert checkpoint.first_index == first and checkpoint.durable_index == 60
    log.close()
    for config in (SMALL, CommitLogConfig(**{**SMALL.__dict__, "verify_on_open": "full"})):
        with CommitLog.open(node, config) as reopened:
            assert (reopened.first_index, reopened.last_index) == (first, 60)
            assert reopened.read_entries(first, 61) == entries[first - 1:]
            assert reopened.recovery.cuts == []


def test_the_last_segment_and_undurable_data_are_never_deleted(tmp_path) -> None:
    node = str(tmp_path / "node")
    log = _filled(node, 30)
    durable_end = log.durable_end
    fill(log, 30)  # written, not yet durable, several segments on
    assert log.segments.bases[-1] > durable_end
    log.delete_before(10**12)
    assert log.segments.bases[0] <= durable_end - 1 < log.segments.bases[0] + S
    log.flush()
    log.delete_before(10**12)
    assert log.segments.bases == [log.segments.base_of(log.end - 1)]  # the last one stays
    log.close()


def test_the_segment_holding_the_durable_point_stays_when_it_ends_there(tmp_path) -> None:
    """The last durable entry fills its segment exactly and the next segment
    is not durable yet: deleting "before the durable end" must keep the
    segment recovery starts from."""
    node = str(tmp_path / "node")
    log = _filled(node, 12)
    room = S - log.end % S
    log.append(log.build_entries(1, [(KIND_CONTROL, b"\x00" * (room - 48))]))
    log.flush()
    assert log.durable_end % S == 0
    fill(log, 3)  # a new segment, not durable
    log.delete_before(log.durable_end)
    assert log.segments.base_of(log.durable_end - 1) in log.segments.bases
    last = log.last_index
    log.abandon()  # crash
    with CommitLog.open(node, SMALL) as reopened:
        assert reopened.last_index >= last - 3


def test_index_files_can_be_rebuilt_when_the_first_index_moved(tmp_path) -> None:
    node = str(tmp_path / "node")
    log = _filled(node)
    entries = log.read_entries(1, 61)
    log.delete_before(log.segments.bases[3])
    first = log.first_index
    assert (first - 1) % SMALL.index_file_records != 0  # its file starts below it
    log.close()
    for name in os.listdir(os.path.join(node, "index")):
        os.remove(os.path.join(node, "index", name))
    with CommitLog.open(node, SMALL) as reopened:
        assert reopened.recovery.index_rebuilt_from is not None
        assert reopened.first_index == first
        assert reopened.read_entries(first, 61) == entries[first - 1:]
    os.remove(os.path.join(node, "checkpoint"))  # and without a checkpoint at all
    with CommitLog.open(node, SMALL) as reopened:
        assert (reopened.first_index, reopened.last_index) == (first, 60)
        assert reopened.read_entries(first, 61) == entries[first - 1:]


@pytest.mark.parametrize("crash_before", ["index", "checkpoint"])
def test_a_crash_after_the_segments_went_reopens_at_the_first_kept_segment(
        tmp_path, monkeypatch, crash_before: str) -> None:
    node = str(tmp_path / "node")
    log = _filled(node)
    entries = log.read_entries(1, 61)

    def crash(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt  # stands for the process dying right here

    if crash_before == "index":
        monkeypatch.setattr(log.index, "delete_before", crash)
    else:
        monkeypatch.setattr(log_module, "write_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        log.delete_before(log.segments.bases[5])
    log.abandon()
    monkeypatch.undo()
    assert read_checkpoint(node).first_index == 1  # the checkpoint never heard of it
    with CommitLog.open(node, SMALL) as reopened:
        first = reopened.first_index
        assert reopened.read_entry(first).position == 5 * S == reopened.segments.bases[0]
        assert reopened.read_entries(first, 61) == entries[first - 1:]
        with pytest.raises(IndexError):
            reopened.read_entry(first - 1)
        assert _index_files(node)[0] == reopened.index.files.base_of(first)
        assert read_checkpoint(node).first_index == first


def test_a_failed_checkpoint_after_deleting_the_durable_segment_reopens(
        tmp_path, monkeypatch) -> None:
    """The checkpoint still names a durable index inside a segment retention
    already deleted (its rewrite failed, or power went before it): the log
    reopens from the first kept segment instead of calling itself corrupt."""
    node = str(tmp_path / "node")
    log = _filled(node)
    fill(log, 20)
    log.flush()  # durable, but the checkpoint still says 60
    entries = log.read_entries(1, 81)

    def fail(*_args: object, **_kwargs: object) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(log_module, "write_checkpoint", fail)
    with pytest.raises(OSError):
        log.delete_before(log.segments.bases[-1])
    log.abandon()
    monkeypatch.undo()
    ck = read_checkpoint(node)
    assert ck.durable_end - 1 < min(int(n) for n in os.listdir(os.path.join(node, "commitlog")))
    with CommitLog.open(node, SMALL) as reopened:
        first = reopened.first_index
        assert first > ck.durable_index
        assert reopened.last_index == 80
        assert reopened.read_entries(first, 81) == entries[first - 1:]


def test_a_checkpoint_captured_before_a_deletion_keeps_the_new_first_index(tmp_path) -> None:
    node = str(tmp_path / "node")
    log = _filled(node)
    token = log.begin_checkpoint()  # the Flusher's thread writes it later
    log.delete_before(log.segments.bases[2])
    assert log.run_checkpoint(token)
    assert read_checkpoint(node).first_index == log.first_index > 1
    log.close()


def test_truncating_every_entry_after_retention_keeps_the_position(tmp_path) -> None:
    node = str(tmp_path / "node")
    log = _filled(node)
    log.delete_before(log.segments.bases[2])
    first, base = log.first_index, log.segments.bases[0]
    log.truncate_after(first - 1)
    assert (log.last_index, log.end) == (first - 1, base)
    log.close()
    with CommitLog.open(node, SMALL) as reopened:
        assert (reopened.first_index, reopened.last_index, reopened.end) == (
            first, first - 1, base)
        fill(reopened, 2, term=2)
        assert reopened.read_entry(first).position == base


def test_a_crash_at_any_point_of_a_deletion_reopens_consistently() -> None:
    node = "/node"
    boxes: dict[str, object] = {}

    def setup(_fs: object) -> None:
        log = _filled(node)
        boxes["entries"] = log.read_entries(1, 61)
        boxes["log"] = log

    def action(_fs: object) -> None:
        log = boxes["log"]
        assert isinstance(log, CommitLog)
        log.delete_before(log.segments.bases[5])

    firsts: set[int] = set()

    def check(_fs: object, completed: bool) -> None:
        entries = boxes["entries"]
        assert isinstance(entries, list)
        with CommitLog.open(node, SMALL) as log:
            first = log.first_index
            firsts.add(first)
            assert log.read_entry(first).position == log.segments.bases[0]
            assert log.last_index == 60
            assert log.read_entries(first, 61) == entries[first - 1:]
            if completed:
                assert log.segments.bases[0] == 5 * S
            assert log.index.files.bases[0] == log.index.files.base_of(first)

    crash_points(node, setup, action, check)
    assert len(firsts) > 2  # crashes left the deletion at several stages
