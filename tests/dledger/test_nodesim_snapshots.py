"""The real-node simulator with compaction: snapshots, log deletion below them
and snapshot installs, with every check of the simulator still holding."""

from __future__ import annotations

import json
from functools import partial

from typer.testing import CliRunner

from commitlog import fileio
from dledger.config import Bugs
from dledger.testing.nodesim import NodeSimOptions, NodeSimResult, run_seed
from dledger.testing.nodesim.checks import final_checks
from dledger.testing.nodesim.compaction import compact
from dledger.testing.nodesim.durability import check_commits
from dledger.testing.nodesim.harness import Harness
from dledger.testing.nodesim.world import Slot
from ledgermq.broker.nodesim_apply import BrokerApplier, CheckpointRot
from ledgermq.cli import app
from ledgermq.cli.commands.sim_real_node import seed_options

COMPACTION = NodeSimOptions(nodes=3, compaction=True, segment_size=4096)
SEEDS = range(1, 41)


def test_compaction_seeds_have_no_violation_and_install() -> None:
    results = [run_seed(s, COMPACTION) for s in SEEDS]
    failed = [(r.seed, r.violation) for r in results if not r.ok]
    assert not failed, failed
    total = {key: sum(r.counts[key] for r in results)
             for key in ("snapshots", "compactions", "segments_deleted", "installs", "lags")}
    # Logs were cut, and nodes that fell behind them caught up by install.
    assert total["compactions"] > 0 and total["segments_deleted"] > 0, total
    assert total["installs"] > 0, total
    assert any("installed snapshot" in line for r in results for line in r.trace)


def test_five_nodes_with_compaction() -> None:
    options = NodeSimOptions(nodes=5, compaction=True, segment_size=4096)
    failed = [(s, r.violation) for s in range(1, 11) if not (r := run_seed(s, options)).ok]
    assert not failed, failed


def test_a_compaction_seed_replays_exactly() -> None:
    first = run_seed(5, COMPACTION)
    again = run_seed(5, COMPACTION)
    assert (first.trace, first.steps, first.counts, first.violation) == (
        again.trace, again.steps, again.counts, again.violation)
    assert first.counts["compactions"] > 0


def test_runs_without_compaction_do_not_compact() -> None:
    result = run_seed(5, NodeSimOptions(nodes=3, segment_size=4096))
    assert result.ok, result.violation
    assert result.counts["snapshots"] == result.counts["installs"] == result.counts["lags"] == 0


def test_the_cli_reports_compactions_and_installs() -> None:
    result = CliRunner().invoke(app, ["sim", "--real-node", "--compaction", "1", "--seeds", "6",
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["violations"] == 0 and summary["compaction_runs"] == 6
    for key in ("snapshots", "compactions", "segments_deleted", "installs"):
        assert key in summary
    assert summary["compactions"] > 0


def _stale_leader_meets_a_compacted_group(bugs: Bugs) -> tuple[Harness, Slot, Slot]:
    """A leader cut off appends a long suffix nobody commits; the others elect
    a leader, write past several segments and compact; then the old leader
    comes back. Its log reaches past the snapshot, with other terms: it must
    restore the snapshot, not take it as held."""
    h = Harness(3, NodeSimOptions(nodes=3, flush="sync", segment_size=4096, bugs=bugs), None)
    with fileio.use(h.fs):
        for slot in h.slots.values():
            h.start(slot)
        h.scheduler.run_until(5.0, lambda: (s := h.leader()) is not None
                              and s.node is not None and s.node.leader_ready)
        stale = h.leader()
        assert stale is not None
        for _ in range(20):
            h.propose(stale)
        h.scheduler.run_until(h.clock.now + 0.5)
        others = [n for n in h.slots if n != stale.nid]
        for n in others:
            h.net.blocked |= {(stale.nid, n), (n, stale.nid)}
        for _ in range(150):
            h.propose(stale)  # appended, never committed
        h.scheduler.run_until(h.clock.now + 5.0, lambda: (s := h.leader()) is not None
                              and s.nid != stale.nid and s.node is not None
                              and s.node.leader_ready)
        leader = h.leader()
        assert leader is not None and leader.nid != stale.nid
        for _ in range(4):
            for _ in range(20):
                h.propose(leader)
            h.scheduler.run_until(h.clock.now + 0.3)
        for n in others:
            compact(h, h.slots[n])
        assert stale.node is not None and leader.node is not None
        assert leader.node.log.first_index > 21
        assert stale.node.last_index > leader.node.storage.snapshot_info.index  # type: ignore[union-attr]
        h.net.blocked.clear()
        h.scheduler.run_until(h.clock.now + 5.0, lambda: stale.node is not None
                              and stale.node.commit_index >= leader.node.commit_index  # type: ignore[union-attr]
                              and not stale.node.install_pending)
        check_commits(h)
        if h.violation is None:
            problem = final_checks(h)
            if problem:
                h.fail(problem)
        for loop in [*h.dead_loops, *h.scheduler.loops]:
            loop.bury()
    return h, stale, leader


def test_a_stale_suffix_past_the_snapshot_is_replaced_by_the_install() -> None:
    h, stale, leader = _stale_leader_meets_a_compacted_group(Bugs())
    assert h.violation is None, h.violation
    assert h.counts["installs"] == 1
    assert stale.node is not None and leader.node is not None
    assert stale.node.log.first_index == leader.node.log.first_index


def test_taking_a_snapshot_as_held_by_index_alone_is_caught() -> None:
    h, _, _ = _stale_leader_meets_a_compacted_group(Bugs.only("snapshot_ignores_term"))
    # The stale node commits (and applies) its own suffix as if the snapshot's:
    # which check sees it first depends on when the commit index reaches it.
    assert h.violation is not None and ("committed entry" in h.violation or (
        "applied entry" in h.violation and "durable on 1 of 3" in h.violation)), h.violation


def test_an_early_snapshot_ack_still_leaves_after_the_install() -> None:
    # The core moves the ack to `messages` (sent before the write); the
    # runtime installs the snapshot before it sends anything of that Ready.
    h, _, _ = _stale_leader_meets_a_compacted_group(Bugs.only("ack_snapshot_before_persist"))
    assert h.violation is None, h.violation
    assert h.counts["installs"] == 1


def _sweep_seed(seed: int, nodes: int, compaction: float, membership: float,
                cq_rot: float = 0.0, flush: str = "mix",
                connection_loss: float = NodeSimOptions.connection_loss,
                reserves: float = NodeSimOptions.reserves) -> NodeSimResult:
    """Run `seed` as `ledgermq sim --real-node` runs it with these shares, and
    require it to pass (a seed with which a sweep found a defect)."""
    applier = partial(BrokerApplier, rot=CheckpointRot(cq_rot)) if cq_rot else BrokerApplier
    options = seed_options(seed, NodeSimOptions(nodes=nodes, applier=applier, flush=flush,
                                                connection_loss=connection_loss,
                                                reserves=reserves),
                           compaction, membership)
    result = run_seed(seed, options)
    assert result.ok, result.violation
    return result


def test_an_install_cut_by_a_power_cut_keeps_every_segment() -> None:
    """Found by this simulator (seed 7000190, 5 nodes): an install moved a
    staged segment into commitlog/ by a rename across the two directories; a
    power cut kept the staging directory's removal but not commitlog/'s new
    name (a file system without a journal writes the two back on their own),
    and the node could not restart: the segment the INSTALL marker names was
    in neither. Segments now move by link, fsync, unlink."""
    assert _sweep_seed(7000190, 5, 0.5, 0.3).counts["installs"] > 0


def test_stale_index_files_never_come_back_after_a_power_cut() -> None:
    """Found by this simulator (seed 9101397, 3 nodes, flush=sync): index
    files a conflict repair removed came back after a power cut, since no
    checkpoint synced the index directory; recovery trusted their records
    and the node could not restart (tests/commitlog/test_truncation_power_cut.py)."""
    _sweep_seed(9101397, 3, 0.7, 0.5)


def test_an_offer_while_an_install_is_pending_keeps_the_staged_files() -> None:
    """Found by this simulator (seed 12001131, 3 nodes, flush=sync): the core
    had restored a leader's snapshot from staged files, and before the driver
    installed them a new leader's SnapshotOffer arrived; staging it discarded
    the staged files, and the install that followed found none (the node
    failed an invariant). Transfer messages now wait while an install is
    pending, not only while it runs."""
    assert _sweep_seed(12001131, 3, 0.7, 0.5, cq_rot=0.3).counts["installs"] > 0


def test_a_node_that_failed_is_not_read_by_the_durability_checks() -> None:
    """Found by this simulator (seed 12003390, 3 nodes, flush=sync): an
    install that failed on an injected full disk left n3's in-memory index
    empty under a log of 1..29; before the harness restarted n3, a commit
    claim of n1 asked what n3's disk held and the harness's own assertion
    failed. A failed node now counts as down in those checks (its files are
    read again at its restart)."""
    assert _sweep_seed(12003390, 3, 0.7, 0.5, cq_rot=0.3).counts["node_failures"] > 0


def test_no_snapshot_is_written_with_a_pending_installs_configuration() -> None:
    """Found by this simulator (seed 12003263, 3 nodes, flush=sync): n2, its
    state machine at index 20, snapshotted while the core had restored a
    leader's snapshot 32 not yet installed; the configuration the node gave
    for index 20 was that snapshot's (voters [1, 2, 3, 4], committed at 26),
    and snapshot 20 recorded it. `membership_at` now refuses an index below
    the core's log (LookupError), and snapshots wait for the install, as the
    broker's snapshotter does."""
    result = _sweep_seed(12003263, 3, 0.7, 0.5, cq_rot=0.3)
    assert result.counts["snapshot_configs_checked"] > 0


def test_a_node_being_restarted_is_checked_under_its_stored_configuration() -> None:
    """Found by this simulator (seed 16100146, 5 nodes, flush=sync, every
    seed with connection loss): n3, power-cut and restarted with a log of
    1..86 holding the configuration [1, 2, 3, 6, 7], was checked before its
    core existed, under the bootstrap voters [1, 2, 3, 4, 5] its
    `membership` gives before start; with the removed n4 and n5 still
    running, the check found it electable without entry 121 (a false
    violation: a node campaigns only once started, under the configuration
    its log holds). The checks now read a restarting node's configuration
    from its stored log (`dledger.raw_node.stored_membership`)."""
    result = _sweep_seed(16100146, 5, 0.7, 0.5, cq_rot=0.3, flush="sync", connection_loss=1.0)
    assert result.counts["removed_running"] > 0


def test_a_disk_full_announced_in_an_earlier_incarnation_is_an_injected_fault() -> None:
    """Found by this simulator (seed 16001537, 3 nodes, flush=sync): an
    injected short write leaves the node's disk full for its next write; n2
    died before that write, and its restart's first write (an index file)
    got the ENOSPC, which the harness, counting no new injected fault, took
    for a failure of the restart itself. The announced disk full now counts
    as an injected fault: the restart is retried like any other that met one."""
    assert _sweep_seed(16001537, 3, 0.7, 0.5, cq_rot=0.3).counts["restart_faults"] > 0


def test_an_empty_consumequeue_left_by_a_cut_tail_counts_as_none() -> None:
    """Found by this simulator (seed 19300254, 3 nodes, flush=async): power
    cuts took n1's unsynced tail, its ConsumeQueues were cut back to its log,
    and queue T0/1 was left empty on n1 while the others never had it. An
    empty queue serves what an absent one does (max offset 0), so the
    state-machine comparison leaves out queues that hold no unit."""
    result = _sweep_seed(19300254, 3, 0.7, 0.5, cq_rot=0.3, reserves=1.0)
    assert result.flush == "async" and result.counts["crashes"] > 0



def test_under_flush_async_the_history_below_the_leaders_log_is_its_own() -> None:
    """Found by this simulator (seed 20800104, flush=async): n3 compacted
    entry 34 of term 5, committed on it and a node whose power cut then took
    it; the group went on with another 34 (term 6) and n3 stopped on the
    divergence. The final checks took n3's record, the first one made of
    index 34, as the group's history below the leader's log, and reported n1,
    which held the group's 34, as diverged. Under async they now take the
    leader's own record of what it deleted, where it has one."""
    options = seed_options(20800104, NodeSimOptions(
        nodes=3, flush="mix", applier=partial(BrokerApplier, rot=CheckpointRot(0.3)),
        reserves=1.0), 0.7, 0.5)
    result = run_seed(20800104, options)
    assert result.flush == "async" and result.counts["compactions"]
    assert result.counts["divergences"] or result.counts["node_failures"]
    assert result.ok, result.violation
