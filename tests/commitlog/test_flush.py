"""Flush policies on a real event loop and real files."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest
from storage_support import message_body

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, Flusher, StorageError
from commitlog.checkpoint import read_checkpoint
from commitlog.disk import Uring, close_files


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
        return flusher.syncs, log.last_index, durable_at_ack

    syncs, appended, margins = asyncio.run(scenario())
    assert appended == 320
    assert min(margins) >= 0
    # Group commit: 16 concurrent appenders share fsyncs.
    assert syncs < appended


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


class _GatedSyncs:
    """Wraps `log.run_sync` (which also makes the Flusher use its thread):
    each sync blocks until the test releases it; tokens are recorded."""

    def __init__(self, log: CommitLog, fail_round: int | None = None) -> None:
        self.tokens: list = []
        self.gates: list[threading.Event] = []
        self.started = threading.Semaphore(0)
        self._run = log.run_sync
        self._fail_round = fail_round
        log.run_sync = self  # type: ignore[method-assign]

    def __call__(self, token) -> None:  # type: ignore[no-untyped-def]
        gate = threading.Event()
        self.tokens.append(token)
        self.gates.append(gate)
        self.started.release()
        gate.wait(10)
        if len(self.tokens) == self._fail_round:
            raise OSError(errno.EIO, "injected fsync failure")
        self._run(token)

    async def wait_started(self, count: int) -> None:
        for _ in range(500):
            if len(self.tokens) >= count:
                return
            await asyncio.sleep(0.002)
        raise AssertionError(f"sync round {count} never started")


async def _spin(times: int = 20) -> None:
    for _ in range(times):
        await asyncio.sleep(0.001)


def test_rounds_pipeline_and_never_ack_before_durable(tmp_path) -> None:
    async def scenario() -> None:
        log = CommitLog.open(str(tmp_path), _config("sync", checkpoint_interval_ms=60_000))
        gated = _GatedSyncs(log)
        flusher = Flusher(log)
        await flusher.start()
        acked: dict[int, int] = {}  # index -> durable_index seen at the ack

        async def append_one() -> None:
            entries = log.build_entries(1, [(KIND_MESSAGES, message_body(1))])
            await flusher.append(entries)
            acked[entries[0].index] = log.durable_index

        first = asyncio.ensure_future(append_one())
        await gated.wait_started(1)
        assert gated.tokens[0].index == 1  # round 1 started at once, for entry 1
        # Entries appended while round 1 is in flight wait for the next round.
        later = [asyncio.ensure_future(append_one()) for _ in range(3)]
        await _spin()
        assert log.last_index == 4 and not first.done() and not any(t.done() for t in later)
        assert len(gated.tokens) == 1  # one job at a time
        gated.gates[0].set()
        await first
        # Round 2 starts as soon as round 1 is done, covering exactly 2..4.
        await gated.wait_started(2)
        assert gated.tokens[1].index == 4
        await _spin()
        assert log.durable_index == 1 and not any(t.done() for t in later)
        gated.gates[1].set()
        await asyncio.gather(*later)
        assert log.durable_index == 4
        assert all(durable >= index for index, durable in acked.items()), acked
        await flusher.close()
        log.close()

    asyncio.run(scenario())


def test_a_failed_fsync_fails_every_waiter_and_the_log(tmp_path) -> None:
    async def scenario() -> None:
        log = CommitLog.open(str(tmp_path), _config("sync", checkpoint_interval_ms=60_000))
        gated = _GatedSyncs(log, fail_round=2)
        flusher = Flusher(log)
        await flusher.start()

        def append_one() -> asyncio.Future[None]:
            entries = log.build_entries(1, [(KIND_MESSAGES, message_body(1))])
            return asyncio.ensure_future(flusher.append(entries))

        first = append_one()
        await gated.wait_started(1)
        gated.gates[0].set()
        await first
        in_flight = [append_one() for _ in range(2)]
        await gated.wait_started(2)
        pending = [append_one() for _ in range(2)]  # wait for a round after the failing one
        await _spin()
        gated.gates[1].set()
        results = await asyncio.gather(*in_flight, *pending, return_exceptions=True)
        assert all(isinstance(r, StorageError) for r in results), results
        assert log.failed is not None and log.durable_index == 1
        with pytest.raises(StorageError):
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1))]))
        with pytest.raises(StorageError):
            await flusher.wait_durable(3)
        await flusher.close()
        log.abandon()

    asyncio.run(scenario())


def _uring_or_skip() -> None:
    try:
        Uring().close()
    except OSError as exc:
        pytest.skip(f"io_uring unavailable here: {exc}")


def test_uring_reports_fsync_results() -> None:
    _uring_or_skip()
    ring = Uring()
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        ring.submit([(fd, True), (-1, True)], 7)
        results: list[tuple[int, int]] = []
        for _ in range(2000):
            results += ring.reap()
            if len(results) == 2:
                break
            time.sleep(0.001)
        assert sorted(results) == sorted([(7, -errno.EBADF), (7, -errno.EINVAL)])
        assert not ring.pending()
    finally:
        os.close(fd)
        ring.close()


def test_sync_rounds_use_the_ring_and_a_ring_error_fails_the_round(tmp_path) -> None:
    _uring_or_skip()

    async def scenario() -> None:
        log = CommitLog.open(str(tmp_path), _config("sync"))
        flusher = Flusher(log)
        await flusher.start()

        async def append_one() -> None:
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1))]))

        await asyncio.gather(*(append_one() for _ in range(10)))
        assert isinstance(flusher._ring, Uring)  # the fast path was taken
        assert log.durable_index == 10 and flusher.syncs >= 1
        # A device that cannot be synced: the round fails, and so does the log.
        begin_sync = log.begin_sync

        def broken_begin_sync():  # type: ignore[no-untyped-def]
            token = begin_sync()
            close_files(token.fds)
            token.fds = [(os.open(os.devnull, os.O_RDONLY), os.devnull, 0)]
            return token

        log.begin_sync = broken_begin_sync  # type: ignore[method-assign]
        with pytest.raises(StorageError, match="fsync failed"):
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1))]))
        assert log.failed is not None and log.durable_index == 10
        await flusher.close()
        log.abandon()

    asyncio.run(scenario())
