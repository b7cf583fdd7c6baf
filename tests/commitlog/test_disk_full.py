"""A full disk, for real: a 512 KiB tmpfs mounted for the test (needs root).

The append that hits ENOSPC fails with DiskFullError and leaves nothing half
written; everything before it stays readable; once space is freed, appends
continue and the log reopens intact.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest
from storage_support import message_body
from support import is_root, require

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, DiskFullError, Flusher
from consumequeue import ConsumeQueueStore


@pytest.fixture
def tiny_disk(tmp_path):
    require(is_root(), "mounting a tmpfs to fill a disk needs root")
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    require(result.returncode == 0, f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


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
