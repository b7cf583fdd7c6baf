"""A node's open builds on snapshots only once their names are durable.

Found by the real-node simulator (seed 18511427): an install's adoption
renamed the snapshot's meta into place and the fsync of its directory failed;
the restarted node saw the snapshot, dropped the install's staging and ran
on a log that starts above the older snapshots; a power cut then took the
meta's name, and the node could not start again ("the log starts at 35 but
the newest snapshot covers only up to 0"). `finish_interrupted_install`,
run at every open, now syncs every snapshot's names first.

Each snapshot write is killed at every file-system call in turn; a new
process opens the data directory as a node does and records the newest
snapshot; then the power is cut, keeping only what was synced: the snapshot
it recorded must still be there."""

from __future__ import annotations

from storage_crash import reopen_points
from storage_support import SMALL, fill

from commitlog import CommitLog, fileio
from commitlog.snapshot import latest_snapshot, write_snapshot
from dledger.runtime.snapshot_transfer import finish_interrupted_install

NODE = "/sim/n1"


def _open_as_a_node_does() -> int:
    log = CommitLog.open(NODE, SMALL)
    try:
        finish_interrupted_install(log)
        newest = latest_snapshot(NODE)
        return newest.index if newest is not None else 0
    finally:
        log.abandon()


def test_a_snapshot_a_restarted_node_found_survives_a_power_cut() -> None:
    ends: dict[int, int] = {}

    def setup() -> None:
        fileio.fs.makedirs(NODE, exist_ok=True)
        log = CommitLog.open(NODE, SMALL)
        fill(log, 20)
        ends[5], ends[12] = log.entry_end(5), log.entry_end(12)
        log.close()
        write_snapshot(NODE, 5, 1, ends[5], b"state at 5")

    def step() -> None:
        write_snapshot(NODE, 12, 1, ends[12], b"state at 12")

    assert reopen_points(NODE, setup, step, _open_as_a_node_does) > 5
