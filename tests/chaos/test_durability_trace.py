"""The power-loss model never drops a byte the writer saw fsynced, and never reads a torn trace.

The trace (`<file>.durable`, commitlog/disk.py) is what `chaos.disk_faults.power_cut`
keeps of each file after a `kill -9`. Here a real writer process appends and
syncs through the storage layer's own `sync_and_close`/`atomic_replace` with
the trace on, and after each sync returns tells the test, over a pipe, the
length it now knows durable: bookkeeping independent of the trace. The test
SIGKILLs it at random moments, runs the power cut, and checks that the cut
kept at least what the writer had been told was durable.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from chaos import disk_faults
from chaos.backend import HarnessError
from commitlog import disk
from consumequeue.checkpoint import (
    DispatchCheckpoint,
    read_dispatch_checkpoint,
    write_dispatch_checkpoint,
)

pytestmark = pytest.mark.timeout(120)

KILLS = 150


def _writer(directory: Path, report_fd: int, seed: int) -> None:
    """The child: append, sync (traced), report; replace a small file now and then."""
    disk.set_durability_trace(True)
    rng = random.Random(seed)
    segment = str(directory / "00000000000000000000")
    checkpoint = str(directory / "checkpoint")
    fd = disk.open_append(segment)
    length = os.fstat(fd).st_size
    generation = 0
    while True:
        chunk = rng.randbytes(rng.randrange(1, 300))
        disk.write_at_end(fd, length, chunk, segment)
        length += len(chunk)
        disk.sync_and_close([(os.dup(fd), segment, length)])
        os.write(report_fd, f"s {length}\n".encode())  # after the traced sync returned
        generation += 1
        if generation % 8 == 0:
            disk.atomic_replace(checkpoint, generation.to_bytes(8, "little"))
            os.write(report_fd, f"c {generation}\n".encode())


def _last_reports(raw: bytes) -> tuple[int, int | None]:
    """The last complete segment length and checkpoint generation the child reported."""
    length, generation = 0, None
    for line in raw.split(b"\n")[:-1]:  # a line cut by the kill is not a report
        kind, value = line.split()
        if kind == b"s":
            length = int(value)
        else:
            generation = int(value)
    return length, generation


def _run_and_kill(directory: Path, seed: int, delay: float) -> tuple[int, int | None]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            os.close(read_fd)
            _writer(directory, write_fd, seed)
        finally:
            os._exit(1)
    os.close(write_fd)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    return _last_reports(b"".join(chunks))


def test_kills_at_random_moments_never_lose_a_reported_fsync(tmp_path: Path) -> None:
    """150 SIGKILLs of a writer mid-sync: after each, the power cut keeps every byte
    the writer had seen synced and the last checkpoint it had seen replaced."""
    rng = random.Random(20261124)
    directory = tmp_path / "data"
    directory.mkdir()
    segment = directory / "00000000000000000000"
    checkpoint = directory / "checkpoint"
    synced_total = 0
    for round_no in range(KILLS):
        reported, generation = _run_and_kill(directory, rng.randrange(1 << 30),
                                             rng.uniform(0.0, 0.02))
        traced = disk.read_durable(str(segment))  # raises on a torn trace
        if reported:
            assert traced is not None and traced >= reported, (round_no, traced, reported)
        disk_faults.power_cut(directory, rng=rng)
        size = segment.stat().st_size if segment.exists() else 0
        assert size >= reported, f"round {round_no}: cut to {size}, {reported} was fsynced"
        if generation is not None:
            assert int.from_bytes(checkpoint.read_bytes(), "little") >= generation
        synced_total = max(synced_total, reported)
    # The kills landed while the writer was working, not before it started.
    assert synced_total > 0


@pytest.mark.parametrize("content", [b"", b"252", b"25x\n", b"-1\n", b"12\n34\n", b"\n"])
def test_a_torn_or_damaged_trace_stops_the_cut_and_changes_nothing(
        tmp_path: Path, content: bytes) -> None:
    """An empty trace is what truncating in place leaves when the kill lands between
    the open and the write; it must never read as 0 bytes durable."""
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(b"a" * 252139)
    (tmp_path / (seg.name + ".durable")).write_bytes(content)
    other = tmp_path / "hardstate"
    other.write_bytes(b"h" * 40)  # untraced: a cut would remove it
    with pytest.raises(HarnessError, match="torn or damaged"):
        disk_faults.power_cut(tmp_path)
    assert seg.stat().st_size == 252139 and other.exists()


def test_record_durable_replaces_the_trace_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    assert disk.read_durable(path) is None
    disk.record_durable(path, 252139)
    assert disk.read_durable(path) == 252139
    disk.record_durable(path, 7)
    assert disk.read_durable(path) == 7
    # Only the trace is left: the temporary was renamed over it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.durable"]


class _KilledAfterRename(Exception):
    """Stands for a SIGKILL right after `atomic_replace`'s rename."""


def test_a_kill_between_a_replace_and_its_trace_leaves_a_whole_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file replaced by rename is there whole or not at all. The ConsumeQueue
    checkpoint of a node killed just after the rename that grew it must not
    be cut back to the old length plus a torn tail by the power cut (the
    chaos run saw a node refuse to start on such a fabricated checkpoint)."""
    monkeypatch.setattr(disk, "_trace", True)
    small = DispatchCheckpoint(10, 1000, {("t", 0): 3})
    write_dispatch_checkpoint(str(tmp_path), small)
    grown = DispatchCheckpoint(20, 2000, {("t", q): 7 for q in range(8)})
    real_sync = disk.sync_directory

    def killed(_path: str) -> None:
        raise _KilledAfterRename

    monkeypatch.setattr(disk, "sync_directory", killed)
    with pytest.raises(_KilledAfterRename):
        write_dispatch_checkpoint(str(tmp_path), grown)
    monkeypatch.setattr(disk, "sync_directory", real_sync)
    disk_faults.power_cut(tmp_path, torn_tail=100, rng=random.Random(7))
    assert read_dispatch_checkpoint(str(tmp_path)) == grown
