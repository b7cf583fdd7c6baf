"""A full disk, for real: a 512 KiB tmpfs mounted for the test (needs root).

The append that hits ENOSPC fails with DiskFullError and leaves nothing half
written; everything before it stays readable; once space is freed, appends
continue and the log reopens intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os

import pytest
from storage_support import message_body
from support import small_tmpfs

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, DiskFullError, Flusher
from commitlog.errors import StorageError
from consumequeue import ConsumeQueueStore


@pytest.fixture
def tiny_disk(tmp_path):
    with small_tmpfs(tmp_path / "tiny", "512k") as mount_point:
        yield str(mount_point)


def test_full_disk_fails_the_append_and_loses_nothing(tiny_disk: str) -> None:
    config = CommitLogConfig(segment_size_bytes=64 * 1024, index_file_records=64)
    data_dir = os.path.join(tiny_disk, "node")
    ballast = os.path.join(tiny_disk, "ballast")
    with open(ballast, "wb") as handle:  # room to free later
        handle.write(b"\0" * 64 * 1024)
    log = CommitLog.open(data_dir, config)
    body = message_body(4, size=900)
    with pytest.raises(DiskFullError, match="disk full"):
        for _ in range(10_000):
            log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
    stored = log.last_index
    assert stored > 10
    entries = log.read_entries(1, stored + 1)
    assert [e.index for e in entries] == list(range(1, stored + 1))
    assert all(e.body == body for e in entries)
    # The failed append left no partial bytes: the segment ends at the log's end.
    last_base = log.segments.bases[-1]
    assert os.path.getsize(log.segments.path(last_base)) == log.end - last_base

    os.remove(ballast)
    log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
    log.close()
    with CommitLog.open(data_dir, config) as reopened:
        assert reopened.recovery.cuts == []
        assert reopened.last_index == stored + 1
        store = ConsumeQueueStore.open(data_dir, reopened)
        assert store.dispatch_committed(reopened.last_index) == stored + 1
        assert store.offsets("T", 0) == (0, 4 * (stored + 1))
        store.close()


def test_full_disk_fails_every_append_new_of_the_round_and_keeps_none(tiny_disk: str) -> None:
    config = CommitLogConfig(segment_size_bytes=64 * 1024, index_file_records=64,
                             flush="sync")
    data_dir = os.path.join(tiny_disk, "node")
    ballast = os.path.join(tiny_disk, "ballast")
    with open(ballast, "wb") as handle:
        handle.write(b"\0" * 64 * 1024)
    body = message_body(4, size=900)

    async def scenario() -> tuple[int, list[object], int]:
        log = CommitLog.open(data_dir, config)
        flusher = Flusher(log, split_after_s=60.0)
        await flusher.start()
        with pytest.raises(DiskFullError):
            for _ in range(10_000):
                await flusher.append_new(1, [(KIND_MESSAGES, body)])
        stored = log.last_index
        # Now a round of 8 callers whose one write cannot fit: all fail, none is kept.
        outcomes = await asyncio.gather(
            *(flusher.append_new(1, [(KIND_MESSAGES, body * 3)]) for _ in range(8)),
            return_exceptions=True)
        assert log.last_index == stored
        os.remove(ballast)
        after = await flusher.append_new(1, [(KIND_MESSAGES, body)])
        await flusher.close()
        log.close()
        return stored, outcomes, after

    stored, outcomes, after = asyncio.run(scenario())
    assert stored > 10
    assert all(isinstance(o, DiskFullError) for o in outcomes)
    assert after == stored + 1
    with CommitLog.open(data_dir, config) as reopened:
        assert reopened.recovery.cuts == []
        assert reopened.last_index == stored + 1
        assert all(e.body == body for e in reopened.read_entries(1, stored + 2))


def test_a_checkpoint_that_hits_a_full_disk_fails_the_flusher_loudly(tiny_disk: str) -> None:
    """It used to end the flush task silently: `log.failed` stayed None and the
    next flush=sync append waited forever (a zombie that looked healthy)."""
    config = CommitLogConfig(segment_size_bytes=64 * 1024, index_file_records=64,
                             flush="sync", checkpoint_interval_ms=0)
    data_dir = os.path.join(tiny_disk, "node")
    body = message_body(4, size=900)

    async def scenario() -> tuple[list[BaseException], BaseException]:
        log = CommitLog.open(data_dir, config)
        failures: list[BaseException] = []
        flusher = Flusher(log, on_failure=failures.append)
        await flusher.start()
        await flusher.append_new(1, [(KIND_MESSAGES, body)])
        # Fill every byte that is left: the next checkpoint cannot be written.
        fd = os.open(os.path.join(tiny_disk, "ballast"), os.O_WRONLY | os.O_CREAT, 0o644)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        outcome: BaseException | None = None
        for _ in range(5):  # each call fails (full disk) or finds the flusher failed
            try:
                async with asyncio.timeout(5.0):
                    await flusher.append_new(1, [(KIND_MESSAGES, body)])
            except StorageError as exc:
                outcome = exc
                if failures:
                    break
        assert outcome is not None
        with pytest.raises(StorageError, match="failed"):
            async with asyncio.timeout(5.0):
                await flusher.wait_durable(log.last_index + 1)
        await flusher.close()
        log.close()
        return failures, outcome

    failures, outcome = asyncio.run(scenario())
    # The checkpoint's index records or its file could not be written.
    assert len(failures) == 1 and isinstance(failures[0], DiskFullError | OSError)
    assert "No space left" in str(failures[0]) or failures[0].errno == errno.ENOSPC
    assert "failed" in str(outcome)
