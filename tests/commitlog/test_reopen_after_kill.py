"""What a restarted process finds, a later power cut keeps.

A process killed without a power cut leaves its unsynced writes and names in
the page cache, where the next process reads them. If that process builds on
them (calls its entries durable, writes a checkpoint over them, acts on a
hard state) before they are durable, a power cut afterwards takes them back
from under it. Found by the real-node simulator (seed 18511427: a snapshot
whose meta's name was never synced; the log's open had the same flaw, its
first flush finding nothing dirty). Here each step is killed at every
file-system call in turn; a new process opens what is left and records it;
then the power is cut, keeping only what was synced, and what it recorded
must still be there.
"""

from __future__ import annotations

from storage_crash import reopen_points
from storage_support import SMALL, fill

from commitlog import CommitLog, fileio
from commitlog.checkpoint import HardState

NODE = "/sim/n1"
Seen = tuple[list[tuple[int, int]], tuple[int, int]]


def _open_and_look() -> Seen:
    log = CommitLog.open(NODE, SMALL)
    try:
        entries = [(e.index, e.term)
                   for e in log.read_entries(log.first_index, log.last_index + 1)]
        assert log.durable_index == log.last_index  # what the open vouches for
        hard = log.load_hard_state()
        return entries, (hard.term, hard.vote)
    finally:
        log.abandon()  # killed again: nothing synced on the way out


def test_entries_and_hard_state_a_reopened_log_found_survive_a_power_cut() -> None:
    state: dict[str, CommitLog] = {}

    def setup() -> None:
        fileio.fs.makedirs(NODE, exist_ok=True)
        log = state["log"] = CommitLog.open(NODE, SMALL)
        fill(log, 4)
        log.flush()
        log.checkpoint()

    def step() -> None:
        # Appends into new segments and a new index file, none of it synced,
        # then a new term and vote (written whole, renamed, the directory synced).
        log = state["log"]
        fill(log, 30, term=2)
        log.save_hard_state(HardState(2, 1, 0))

    assert reopen_points(NODE, setup, step, _open_and_look) > 10
