"""A full disk, for real: a 512 KiB tmpfs mounted for the test (needs root).

The append that hits ENOSPC fails with DiskFullError and leaves nothing half
written; everything before it stays readable; once space is freed, appends
continue and the log reopens intact.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from storage_support import message_body
from support import is_root, require

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, DiskFullError
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
