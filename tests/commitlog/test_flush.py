"""Flush policies on a real event loop and real files."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest
from storage_support import message_body

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, Flusher, StorageError, fileio
from commitlog.checkpoint import read_checkpoint


def _config(flush: str, **extra: int) -> CommitLogConfig:
    return CommitLogConfig(segment_size_bytes=1 << 20, flush=flush, **extra)


def test_sync_appends_complete_only_when_durable_and_share_fsyncs(tmp_path) -> None:
    async def scenario() -> tuple[int, int, list[int]]:
        log = CommitLog.open(str(tmp_path), _config("sync"))
        flusher = Flusher(log)
        await flusher.start()
        durable_at_ack: list[int] = []

        async def appender(n: int) -> None:
            for _ in range(n):
                entries = log.build_entries(1, [(KIND_MESSAGES, message_body(1))])
                await flusher.append(entries)
                # The ack means this entry is covered by an fsync.
                durable_at_ack.append(log.durable_index - entries[-1].index)

        await asyncio.gather(*(appender(20) for _ in range(16)))
        await flusher.close()
        log.close()
        # The round figures: time in fdatasync, and passing to its thread and back.
        assert flusher.sync_s > 0
        assert flusher.sync_start_wait_s > 0 and flusher.sync_resume_wait_s > 0
        return flusher.syncs, log.last_index, durable_at_ack

    syncs, appended, margins = asyncio.run(scenario())
    assert appended == 320
    assert min(margins) >= 0
    # Group commit: 16 concurrent appenders share fsyncs.
    assert syncs < appended


def _run_appenders(tmp_path, appenders: int, each: int, **flusher_options: float
                   ) -> tuple[Flusher, list[int]]:
    """Concurrent flush=sync appenders; per ack, how far the durable point is
    past the acknowledged entry (never negative when acks follow fsyncs)."""
    async def scenario() -> tuple[Flusher, list[int]]:
        log = CommitLog.open(str(tmp_path), _config("sync"))
        flusher = Flusher(log, **flusher_options)
        await flusher.start()
        margins: list[int] = []

        async def appender() -> None:
            for _ in range(each):
                entries = log.build_entries(1, [(KIND_MESSAGES, message_body(1))])
                await flusher.append(entries)
                margins.append(log.durable_index - entries[-1].index)

        await asyncio.gather(*(appender() for _ in range(appenders)))
        await flusher.close()
        log.close()
        return flusher, margins

    return asyncio.run(scenario())


def test_a_long_loop_pass_starts_its_sync_early_and_acks_still_follow_fsyncs(tmp_path) -> None:
    # split_after_s=0: every pass starts its round at its first append, so the
    # rest of the pass appends while that fsync runs.
    flusher, margins = _run_appenders(tmp_path, appenders=64, each=10, split_after_s=0.0)
    assert len(margins) == 640 and min(margins) >= 0
    assert flusher.early_rounds > 0
    # Appends made during a round's fsync wait for a later round.
    assert flusher.syncs > 10


def test_passes_shorter_than_a_sync_are_never_split(tmp_path) -> None:
    # A split delay no pass reaches: every round waits for its pass to end,
    # so 16 appenders in lockstep share each fsync (16 acks per round).
    flusher, margins = _run_appenders(tmp_path, appenders=16, each=20, split_after_s=60.0)
    assert min(margins) >= 0
    assert flusher.early_rounds == 0
    assert flusher.synced_entries / flusher.syncs >= 15


def test_async_appends_return_at_once_and_are_synced_in_the_background(tmp_path) -> None:
    async def scenario() -> tuple[int, int]:
        log = CommitLog.open(str(tmp_path), _config("async", flush_interval_ms=20,
                                                    checkpoint_interval_ms=20))
        flusher = Flusher(log)
        await flusher.start()
        for _ in range(50):
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1))]))
        not_yet = log.durable_index
        await flusher.wait_durable(log.last_index)  # the background flusher gets there
        durable = log.durable_index
        await flusher.close()
        log.abandon()
        return not_yet, durable

    not_yet, durable = asyncio.run(scenario())
    assert not_yet < 50 and durable == 50
    checkpoint = read_checkpoint(str(tmp_path))
    assert checkpoint is not None and checkpoint.durable_index == 50


def test_async_flush_by_bytes_threshold(tmp_path) -> None:
    async def scenario() -> int:
        log = CommitLog.open(str(tmp_path), _config("async", flush_interval_ms=60_000,
                                                    flush_bytes=4096))
        flusher = Flusher(log)
        await flusher.start()
        for _ in range(10):
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1, 1000))]))
        await flusher.wait_durable(5)  # woken by bytes, not by the minute-long interval
        durable = log.durable_index
        await flusher.close()
        log.close()
        return durable

    assert asyncio.run(scenario()) >= 5


def test_waiters_of_truncated_entries_fail_instead_of_hanging(tmp_path) -> None:
    async def scenario() -> None:
        log = CommitLog.open(str(tmp_path), _config("async", flush_interval_ms=60_000))
        flusher = Flusher(log)
        await flusher.start()
        await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1))] * 3))
        assert log.durable_index < 3
        waiter = asyncio.ensure_future(flusher.wait_durable(3))
        await asyncio.sleep(0)  # the waiter is now waiting for a sync round
        log.truncate_after(1)
        # Entry 3 is replaced by a different entry at the same index: the old
        # waiter must not be told its entry is durable.
        log.append(log.build_entries(2, [(KIND_MESSAGES, message_body(2))] * 2))
        flusher.appended()
        with pytest.raises(StorageError, match="truncated"):
            await waiter
        with pytest.raises(StorageError, match="not in the log"):
            await flusher.wait_durable(9)
        await flusher.close()
        log.close()

    asyncio.run(scenario())


def test_append_new_places_a_whole_pass_in_one_write_and_acks_after_fsync(tmp_path) -> None:
    async def scenario() -> tuple[Flusher, dict[int, bytes], list[int], CommitLog]:
        log = CommitLog.open(str(tmp_path), _config("sync"))
        flusher = Flusher(log, split_after_s=60.0)  # whole-pass rounds
        await flusher.start()
        written: dict[int, bytes] = {}
        margins: list[int] = []

        async def appender(n: int) -> None:
            for i in range(10):
                body = message_body(1 + (n + i) % 3)
                index = await flusher.append_new(1, [(KIND_MESSAGES, body)])
                margins.append(log.durable_index - index)
                written[index] = body

        await asyncio.gather(*(appender(n) for n in range(32)))
        await flusher.close()
        return flusher, written, margins, log

    flusher, written, margins, log = asyncio.run(scenario())
    assert sorted(written) == list(range(1, 321))  # every call got its own index
    assert min(margins) >= 0  # returned only once durable
    assert flusher.synced_entries / flusher.syncs >= 30  # a pass shares one round
    assert [e.body for e in log.read_entries(1, 321)] == [written[i] for i in range(1, 321)]
    log.close()
    with CommitLog.open(str(tmp_path), _config("sync")) as reopened:
        assert reopened.recovery.cuts == [] and reopened.last_index == 320


def test_append_new_refuses_bad_calls_without_touching_the_round(tmp_path) -> None:
    async def scenario() -> tuple[list[str], int]:
        log = CommitLog.open(str(tmp_path), _config("sync", entry_size_bytes_max=4096,
                                                    message_size_bytes_max=4096))
        flusher = Flusher(log)
        await flusher.start()
        await flusher.append_new(3, [(KIND_MESSAGES, message_body(1))])
        errors = []
        good = asyncio.ensure_future(flusher.append_new(3, [(KIND_MESSAGES, message_body(1))]))
        for call in (flusher.append_new(3, [(KIND_MESSAGES, b"x" * 5000)]),
                     flusher.append_new(2, [(KIND_MESSAGES, message_body(1))]),
                     flusher.append_new(3, [(99, b"unknown kind")]),
                     flusher.append_new(3, [])):
            try:
                await call
            except (StorageError, ValueError) as exc:
                errors.append(type(exc).__name__)
        index = await good
        await flusher.close()
        log.close()
        return errors, index

    errors, index = asyncio.run(scenario())
    assert errors == ["MessageTooLargeError", "PositionMismatchError", "ValueError",
                      "ValueError"]
    assert index == 2


def test_append_new_cancelled_before_its_round_writes_nothing(tmp_path) -> None:
    async def scenario() -> tuple[int, list[bytes]]:
        log = CommitLog.open(str(tmp_path), _config("sync"))
        flusher = Flusher(log)
        await flusher.start()
        doomed = asyncio.ensure_future(flusher.append_new(1, [(KIND_MESSAGES, b"doomed")]))
        kept = asyncio.ensure_future(flusher.append_new(1, [(KIND_MESSAGES, b"kept")]))
        await asyncio.sleep(0)  # both queued, their round not started yet
        doomed.cancel()
        index = await kept
        await flusher.close()
        bodies = [e.body for e in log.read_entries(1, log.last_index + 1)]
        log.close()
        return index, bodies

    index, bodies = asyncio.run(scenario())
    assert (index, bodies) == (1, [b"kept"])


def test_append_new_under_async_flush_writes_at_once(tmp_path) -> None:
    async def scenario() -> tuple[int, int, int]:
        log = CommitLog.open(str(tmp_path), _config("async", flush_interval_ms=60_000))
        flusher = Flusher(log)
        await flusher.start()
        index = await flusher.append_new(1, [(KIND_MESSAGES, b"a"), (KIND_MESSAGES, b"b")])
        appended, durable = log.last_index, log.durable_index
        await flusher.close()
        log.close()
        return index, appended, durable

    assert asyncio.run(scenario()) == (2, 2, 0)


class _FailingSyncs(fileio.OsFileSystem):
    """The real file system whose fdatasync fails with EIO once armed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.fdatasync = self._fdatasync

    def _fdatasync(self, fd: int) -> None:
        if self.armed:
            raise OSError(errno.EIO, "injected fdatasync failure")
        os.fdatasync(fd)


def test_a_sync_in_place_is_durable_when_it_returns_and_a_failed_one_fails_the_log(
        tmp_path) -> None:
    """`Flusher.sync_now` (flush=sync, no round in flight): the fdatasync
    runs in the caller's pass, the durable point covers everything written
    when it returns, no thread hand-off is counted; with a round in flight
    it declines. A failing fdatasync fails the log for good and tells the
    owner once, as a failed round does."""
    failures: list[BaseException] = []

    async def scenario() -> None:
        filesystem = _FailingSyncs()
        with fileio.use(filesystem):
            log = CommitLog.open(str(tmp_path), _config("sync"))
            flusher = Flusher(log, on_failure=failures.append)
            await flusher.start()
            for n in range(5):
                log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(n))]))
                assert flusher.idle and flusher.sync_now()
                assert log.durable_index == log.last_index == n + 1
            assert flusher.inline_syncs == flusher.syncs == 5
            assert flusher.sync_start_wait_s == flusher.sync_resume_wait_s == 0
            # A round in flight (an append waiting on the thread): not now.
            waiting = asyncio.ensure_future(flusher.append(
                log.build_entries(1, [(KIND_MESSAGES, message_body(9))])))
            await asyncio.sleep(0)
            while flusher.idle and not waiting.done():
                await asyncio.sleep(0)
            if not waiting.done():
                assert not flusher.sync_now()
            await waiting
            filesystem.armed = True
            log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(10))]))
            with pytest.raises(StorageError, match="fsync failed"):
                flusher.sync_now()
            assert log.failed is not None and flusher.failed is not None
            assert len(failures) == 1
            assert not flusher.idle
            with pytest.raises(StorageError):
                await flusher.wait_durable(log.last_index)
            filesystem.armed = False
            await flusher.close()
            log.close()

    asyncio.run(scenario())
