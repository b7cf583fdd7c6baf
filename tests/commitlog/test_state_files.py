"""The checkpoint and hard-state files have one owner: no stale value, no shared temporary name.

A checkpoint is captured on the loop and written on the Flusher's thread; a
truncation on the loop lowers it meanwhile. The thread's late write must not
restore the higher value (after a crash the log would refuse to open: "the
checkpoint says index 10 is durable but the valid log ends at index 4").
"""

from __future__ import annotations

import os
import threading

from storage_support import SMALL, fill

from commitlog import CommitLog, HardState
from commitlog.checkpoint import read_checkpoint, write_checkpoint
from commitlog.disk import atomic_replace, read_small_file


def test_checkpoint_captured_before_a_truncation_is_not_written_after_it(tmp_path) -> None:
    data_dir = str(tmp_path / "n1")
    log = CommitLog.open(data_dir, SMALL)
    fill(log, 10)
    log.flush()
    token = log.begin_checkpoint()  # on the loop: vouches for index 10
    assert token.checkpoint.durable_index == 10
    log.truncate_after(4)  # Raft conflict repair, on the loop, meanwhile
    assert not log.run_checkpoint(token)  # the thread's late write is dropped
    assert read_checkpoint(data_dir).durable_index == 4
    log.abandon()  # a crash: nothing more is written
    with CommitLog.open(data_dir, SMALL) as reopened:
        assert reopened.last_index == 4


def test_checkpoint_without_a_truncation_is_written(tmp_path) -> None:
    data_dir = str(tmp_path / "n1")
    log = CommitLog.open(data_dir, SMALL)
    fill(log, 6)
    log.flush()
    token = log.begin_checkpoint()
    assert log.run_checkpoint(token)
    assert read_checkpoint(data_dir).durable_index == 6
    log.close()


def test_concurrent_replacements_of_one_file_never_collide(tmp_path) -> None:
    """Two writers of one file (the Flusher's thread and the loop) used to share
    `<file>.tmp`: one's rename could take the other's file away."""
    target = str(tmp_path / "checkpoint")
    errors: list[BaseException] = []

    def writer(tag: bytes) -> None:
        try:
            for i in range(300):
                atomic_replace(target, tag + b"%04d" % i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in (b"a", b"b", b"c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert read_small_file(target)[:1] in (b"a", b"b", b"c")
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_hard_state_and_checkpoint_writes_leave_no_temporary_files(tmp_path) -> None:
    data_dir = str(tmp_path / "n1")
    log = CommitLog.open(data_dir, SMALL)
    fill(log, 3)
    log.save_hard_state(HardState(2, 1, 3))
    write_checkpoint(data_dir, log.checkpoint())
    log.close()
    assert [n for n in os.listdir(data_dir) if n.endswith(".tmp")] == []
    assert log.load_hard_state() == HardState(2, 1, 3)


def test_the_durability_trace_never_outlives_a_cut(tmp_path) -> None:
    """Chaos tracing: after a truncation the trace may not claim bytes that
    were rewritten since, and a removed segment's trace must not pass on to a
    new segment of the same name (the power cut would keep unsynced bytes)."""
    from commitlog.disk import read_durable, set_durability_trace

    data_dir = str(tmp_path / "n1")
    set_durability_trace(True)
    try:
        log = CommitLog.open(data_dir, SMALL)
        fill(log, 30)  # several 4 KiB segments
        log.flush()
        bases = list(log.segments.bases)
        assert len(bases) >= 3
        last = log.segments.path(bases[-1])
        assert read_durable(last) == log.end - bases[-1]
        keep = log.last_index - 12
        log.truncate_after(keep)
        for base in bases:
            path = log.segments.path(base)
            if base in log.segments.bases:
                assert read_durable(path) <= log.segments.lengths[base]
            else:
                assert read_durable(path) is None  # removed with its segment
        log.close()
    finally:
        set_durability_trace(False)
