"""A conflict repair (truncate_after) under a power cut, on the simulator's file system.

The Raft follower cuts entries of an old term and writes the leader's
versions; with flush=async nothing is fsynced until the next periodic sync.
If the disk then keeps the later segment file's new entries but not the
earlier file's cut, the recovered log reads as the old entry followed by the
new ones: well formed, and a mix of two logs that a follower would commit
without noticing (found by the real-node simulator, seed 190 with
`--membership 1`). The cut is therefore made durable at once; whatever a
power cut keeps afterwards is a prefix of the new log (or of the old one).
"""

from __future__ import annotations

import os
import random

from storage_crash import KeepNothing
from storage_support import SMALL, fill, message_body

from commitlog import KIND_MESSAGES, CommitLog, fileio
from dledger.testing.nodesim.simfs import NO_FAULTS, SimFileSystem

NODE = "/sim/n1"


def _terms(log: CommitLog) -> list[tuple[int, int]]:
    return [(e.index, e.term) for e in log.read_entries(log.first_index, log.last_index + 1)]


def test_a_power_cut_after_a_conflict_repair_never_mixes_the_two_logs() -> None:
    fs = SimFileSystem(random.Random(1))
    with fileio.use(fs):
        fs.makedirs(NODE)
        fs.set_faults(NODE, NO_FAULTS)  # registers the node: its files, its power cut
        log = CommitLog.open(NODE, SMALL)
        fill(log, 30, term=1)
        log.flush()
        log.checkpoint()
        # The last entry of the second segment, so the entry after it starts the
        # third segment: the placement both versions of the log share.
        second = log.segments.bases[1]
        last_of_second = max(e.index for e in log.read_entries(1, 31) if e.position < second
                             + SMALL.segment_size_bytes and e.position >= second)
        assert log.last_index > last_of_second
        log.truncate_after(last_of_second - 1)
        # The leader's versions, same sizes, term 2: the first lands where the
        # cut one was (last of the second segment), the rest in a new third file.
        fill(log, 30 - (last_of_second - 1), term=2)
        new_log = _terms(log)
        third = log.segments.path(log.segments.bases[2])
        assert log.read_entry(last_of_second + 1).position == log.segments.bases[2]
        # The page cache writes the third file back first (its name and bytes
        # durable), then the power goes.
        fd = fs.open(third, os.O_RDWR)
        fs.fsync(fd)
        fs.close(fd)
        dir_fd = fs.open(os.path.dirname(third), os.O_RDONLY | os.O_DIRECTORY)
        fs.fsync(dir_fd)
        fs.close(dir_fd)
        fs.crash(NODE, KeepNothing())
        with CommitLog.open(NODE, SMALL) as reopened:
            recovered = _terms(reopened)
    # Never entry `last_of_second` of term 1 followed by entries of term 2.
    assert recovered == new_log[:len(recovered)], recovered[last_of_second - 3:]
    assert len(recovered) >= last_of_second - 1


def test_index_files_a_checkpoint_vouches_for_survive_a_power_cut_by_name() -> None:
    """Found by the real-node simulator (seed 9101397, 3 nodes, flush=sync):
    a conflict repair removed whole index files and the leader's entries,
    of the same sizes, created them again; the checkpoints synced the
    records but not the index directory, so a power cut brought the removed
    files back with the old entries' records, which recovery trusts below
    the checkpoint's segment, and reads failed ("entry header disagrees with
    the index": another term). Checkpoints now sync the index directory
    when a file was created or removed."""
    fs = SimFileSystem(random.Random(1))
    with fileio.use(fs):
        fs.makedirs(NODE)
        fs.set_faults(NODE, NO_FAULTS)
        log = CommitLog.open(NODE, SMALL)
        fill(log, 30, term=1)
        log.flush()
        log.checkpoint()
        # The kernel writes the index directory back in its own time: the
        # names of these files become durable.
        dir_fd = fs.open(os.path.join(NODE, "index"), os.O_RDONLY | os.O_DIRECTORY)
        fs.fsync(dir_fd)
        fs.close(dir_fd)
        log.truncate_after(16)  # index files 17 and 25 go whole
        for i in range(16, 30):  # the leader's versions: same sizes, same positions
            log.append(log.build_entries(2, [(KIND_MESSAGES, message_body(1, 300 + i % 7))]))
        log.flush()
        log.checkpoint()
        expected = _terms(log)
        assert len(log.segments.bases) > 2  # recovery trusts the index below the last one
        fs.crash(NODE, KeepNothing())
        with CommitLog.open(NODE, SMALL) as reopened:
            assert _terms(reopened) == expected
