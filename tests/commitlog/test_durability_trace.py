"""The durability trace: what a power cut would keep, recorded at every fsync.

With the trace on, cutting every file back to its `.durable` length (and
removing files that were never synced) models losing the page cache. Entries
acknowledged under flush=sync must survive that; entries only written need not.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, Flusher
from commitlog.disk import set_durability_trace
from tests.storage_support import message_body


@pytest.fixture
def tracing():
    set_durability_trace(True)
    yield
    set_durability_trace(False)


def power_cut(data_dir: str) -> int:
    """Drop every byte not recorded as durable; returns the bytes dropped."""
    dropped = 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".durable") or name == "LOCK":
                continue
            size = os.path.getsize(path)
            try:
                with open(path + ".durable") as handle:
                    keep = int(handle.read())
            except FileNotFoundError:
                keep = -1  # never synced: after a power cut it may not exist at all
            if keep < 0:
                os.remove(path)
                dropped += size
            elif keep < size:
                os.truncate(path, keep)
                dropped += size - keep
    return dropped


def test_acknowledged_sync_appends_survive_a_power_cut(tmp_path, tracing) -> None:
    data_dir = str(tmp_path)
    config = CommitLogConfig(segment_size_bytes=16 * 1024, index_file_records=16,
                             checkpoint_interval_ms=10)

    async def scenario() -> int:
        log = CommitLog.open(data_dir, config)
        flusher = Flusher(log, sync=True)
        await flusher.start()
        for i in range(40):
            await flusher.append(log.build_entries(1, [(KIND_MESSAGES, message_body(1 + i % 3))]))
        acknowledged = log.last_index
        await flusher.close()
        for _ in range(5):  # written after the last sync: a power cut may drop these
            log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(2))]))
        log.abandon()
        return acknowledged

    acknowledged = asyncio.run(scenario())
    assert power_cut(data_dir) > 0
    with CommitLog.open(data_dir, config) as log:
        assert log.last_index == acknowledged
        assert len(log.read_entries(1, acknowledged + 1)) == acknowledged


def test_trace_lengths_follow_the_syncs(tmp_path, tracing) -> None:
    data_dir = str(tmp_path)
    with CommitLog.open(data_dir, CommitLogConfig(segment_size_bytes=1 << 20)) as log:
        log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(3))]))
        log.flush()
        segment = log.segments.path(0)
        with open(segment + ".durable") as handle:
            assert int(handle.read()) == os.path.getsize(segment) == log.end
        log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(3))]))
        with open(segment + ".durable") as handle:
            assert int(handle.read()) < os.path.getsize(segment)
    # `.durable` files are ignored by the storage engine, not reported as foreign.
    with CommitLog.open(data_dir) as log:
        assert log.recovery.foreign_files == []
