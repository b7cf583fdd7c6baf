"""The durable point moves past a sync's end only once every sync begun before it ended.

A sync covers the files and directory entries it took when it began. The
Flusher's round takes them on the loop and fsyncs them on its thread; a
synchronous flush meanwhile (a conflict repair makes its cut durable at
once) takes only what changed since. Finished first, it used to move the
durable point past entries that only the round's fsync covers, a new
segment's name among them: the real-node simulator (seed 7000784, 5 nodes)
saw a hard state claim an entry whose file name a power cut would still
take. Checked here on the simulator's file system, which knows what is
durable.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from storage_support import SMALL, fill

from commitlog import CommitLog, fileio
from commitlog.log import SyncToken
from dledger.testing.nodesim.simfs import NO_FAULTS, SimFileSystem

NODE = "/sim/n1"


def durable_through(fs: SimFileSystem, log: CommitLog) -> int:
    """The last index whose entry, and every one before it, a power cut now keeps."""
    index = log.first_index - 1
    for entry in log.read_entries(log.first_index, log.last_index + 1):
        base = log.segments.base_of(entry.position)
        path = log.segments.path(base)
        at, size = entry.position - base, entry.size
        kept = fs.durable_slice(path, at, size)
        if kept is None or kept != fs.volatile_slice(path, at, size):
            break
        index = entry.index
    return index


@contextmanager
def sim_log() -> Iterator[tuple[SimFileSystem, CommitLog]]:
    """A log on the simulator's file system, closed at the end."""
    fs = SimFileSystem(random.Random(1))
    fs.makedirs(NODE)
    fs.set_faults(NODE, NO_FAULTS)
    with fileio.use(fs):
        log = CommitLog.open(NODE, SMALL)
        yield fs, log


def synced(log: CommitLog, token: SyncToken) -> None:
    log.run_sync(token)
    log.finish_sync(token)


def test_a_sync_that_ends_first_waits_for_the_one_begun_before_it() -> None:
    with sim_log() as (fs, log):
        fill(log, 10)  # more than one segment: two files and a new name
        assert len(log.segments.bases) > 1
        first = log.begin_sync()  # the Flusher's round: every file, the directory
        fill(log, 3)
        second = log.begin_sync()  # only the last segment's new bytes
        assert not second.directory_dirty
        synced(log, second)
        # Before: durable_index == second.index, with the first segment's
        # bytes and the second's name not yet synced.
        assert log.durable_index == 0
        assert durable_through(fs, log) < second.index
        synced(log, first)
        assert log.durable_index == second.index == durable_through(fs, log)


def test_a_conflict_repair_during_a_round_claims_only_what_is_durable() -> None:
    with sim_log() as (fs, log):
        fill(log, 6)
        round_token = log.begin_sync()  # in flight on the Flusher's thread
        fill(log, 4)
        log.truncate_after(8)  # its flush ends before the round's
        assert log.durable_index <= durable_through(fs, log)
        fill(log, 2, term=2)
        synced(log, round_token)  # older than the cut: says nothing itself
        # The cut's own flush, held until the round ended (an fsync covers
        # what the file holds when it runs, so more may be durable).
        assert log.durable_index == 8 <= durable_through(fs, log)
        log.flush()
        assert log.durable_index == log.last_index == durable_through(fs, log)


def test_syncs_finished_in_order_move_the_point_at_once() -> None:
    with sim_log() as (fs, log):
        fill(log, 3)
        synced(log, log.begin_sync())
        assert log.durable_index == 3 == durable_through(fs, log)
