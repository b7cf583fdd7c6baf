"""The core simulator with compaction and snapshot install: a CI seed sweep and its teeth.

The sweep runs every seed with compaction (`SimOptions(compaction=1.0)`) and
requires zero violations AND that the runs really exercised snapshots:
compactions, installs, restarts from a snapshot, failed transfers. The
mutant and bug tests prove the checks catch a broken install: a follower
that installs the wrong state, one that acknowledges before the install is
durable, one that takes a snapshot as held without checking its term.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest

from dledger.config import Bugs
from dledger.entry import Entry, HardState
from dledger.storage import SnapshotMeta
from dledger.testing import SimCluster, SimDisk, SimOptions, replay_hint, run_seed
from dledger.testing.statemachine import SimSnapshot, SimStateMachine, digest_of
from election.roles import Role

SWEEP_3 = range(1, 201)
SWEEP_5 = range(1, 81)
CHUNK = 50
MUTANT_BUDGET = 50


def sweep(seeds: list[int], nodes: int) -> Counter[str]:
    options = SimOptions(nodes=nodes, flush="mix", compaction=1.0)
    totals: Counter[str] = Counter()
    for seed in seeds:
        result = run_seed(seed, options)
        if not result.ok:
            trace = "\n".join(result.trace[-30:])
            pytest.fail(f"seed={seed} nodes={nodes} flush={result.flush}: {result.violation}\n"
                        f"{trace}\n{replay_hint(seed, nodes, result.flush, 1.0)}")
        assert result.compaction
        totals["compactions"] += result.compactions
        totals["installs"] += result.installs
        totals["runs_with_install"] += result.installs > 0
        totals["snapshot_restarts"] += result.snapshot_restarts
        totals["transfer_failures"] += result.transfer_failures
        totals["far_behind"] += result.far_behind
    print(f"{nodes} nodes, seeds {seeds[0]}-{seeds[-1]}: {dict(totals)}")
    return totals


def chunks(seeds: range) -> list[list[int]]:
    values = list(seeds)
    return [values[i : i + CHUNK] for i in range(0, len(values), CHUNK)]


@pytest.mark.parametrize("seeds", chunks(SWEEP_3), ids=lambda s: f"{s[0]}-{s[-1]}")
def test_sweep_with_compaction_3_nodes(seeds: list[int]) -> None:
    totals = sweep(seeds, 3)
    assert totals["compactions"] > 0 and totals["installs"] > 0
    # Most seeds see a follower install (every FarBehind seed should).
    assert totals["runs_with_install"] >= len(seeds) // 2
    assert totals["snapshot_restarts"] > 0 and totals["transfer_failures"] > 0


@pytest.mark.parametrize("seeds", chunks(SWEEP_5), ids=lambda s: f"{s[0]}-{s[-1]}")
def test_sweep_with_compaction_5_nodes(seeds: list[int]) -> None:
    totals = sweep(seeds, 5)
    assert totals["installs"] > 0 and totals["snapshot_restarts"] > 0


def test_without_compaction_seeds_replay_as_before() -> None:
    """compaction=0.0 takes nothing from the main rng: the same run, event for event,
    as a seed the compaction draw left out."""
    for seed in range(1, 40):
        with_share = run_seed(seed, SimOptions(nodes=3, flush="mix", compaction=0.5))
        if with_share.compaction:
            continue
        without = run_seed(seed, SimOptions(nodes=3, flush="mix", compaction=0.0))
        assert not without.compaction and without.compactions == without.installs == 0
        assert (without.steps, without.committed, without.elections) == (
            with_share.steps, with_share.committed, with_share.elections)


def test_replay_with_compaction_is_exact() -> None:
    options = SimOptions(nodes=3, flush="mix", compaction=1.0)
    a = run_seed(2, options)
    b = run_seed(2, options)
    assert a.installs > 0
    assert (a.steps, a.compactions, a.installs, a.violation) == (
        b.steps, b.compactions, b.installs, b.violation)


def first_failure(options: SimOptions) -> tuple[int, str]:
    for seed in range(1, MUTANT_BUDGET + 1):
        result = run_seed(seed, options)
        if not result.ok:
            assert result.violation is not None
            again = run_seed(seed, options)
            assert again.violation == result.violation
            return seed, result.violation
    pytest.fail(f"{options} not detected in {MUTANT_BUDGET} seeds")


def test_checker_catches_an_install_of_the_wrong_state() -> None:
    seed, violation = first_failure(
        SimOptions(nodes=3, compaction=1.0, install_mutant="stale_state"))
    print(f"stale_state install: found at seed {seed}: {violation}")
    assert "state" in violation


@pytest.mark.parametrize("bug", ["ack_snapshot_before_persist", "snapshot_ignores_term"])
def test_checker_catches_snapshot_bugs_in_the_core(bug: str) -> None:
    seed, violation = first_failure(
        SimOptions(nodes=3, compaction=1.0, far_behind_probability=1.0, bugs=Bugs.only(bug)))
    print(f"{bug}: found at seed {seed}: {violation}")


def test_restart_of_a_compacted_node_starts_after_its_snapshot() -> None:
    """Crash a node whose log was compacted: it restarts with first_index > 1 and its
    state machine at the snapshot, and the group converges with it."""
    cluster = SimCluster(7, 3, Bugs(), compaction=True)
    for k in range(30):
        cluster.call_at(20 + 20 * k, partial(cluster.propose, f"w{k}".encode()))
    cluster.run_until(800)
    victim = next(n.id for n in cluster.alive() if n.role is not Role.LEADER)
    machine = cluster.machines[victim]
    assert machine.index > 2
    cluster.snapshots.compact(victim, to_applied=True)
    snap = cluster.disks[victim].durable_snapshot
    assert snap is not None and snap.index == machine.index
    cluster.crash(victim)
    cluster.restart(victim)
    node = cluster.nodes[victim]
    assert node is not None
    assert node.log.first_index() == snap.index + 1 and node.applied == snap.index
    assert cluster.machines[victim].digest == snap.digest
    assert cluster.stats.snapshot_restarts == 1
    cluster.run_until(2500)
    leader = next(n for n in cluster.alive() if n.role is Role.LEADER)
    restarted = cluster.machines[victim]
    assert restarted.index == leader.applied
    assert restarted.digest == digest_of(cluster.disks[leader.id].full_log()[: restarted.index])


def test_state_machine_snapshot_and_digest() -> None:
    cluster = SimCluster(3, 3, Bugs(), compaction=False)
    for k in range(5):
        cluster.call_at(200 + 30 * k, partial(cluster.propose, f"d{k}".encode()))
    cluster.run_until(1200)
    leader = next(n for n in cluster.alive() if n.role is Role.LEADER)
    log = cluster.disks[leader.id].full_log()
    machine = SimStateMachine()
    for entry in log[: leader.applied]:
        machine.apply(entry)
    snap = machine.snapshot(3)
    assert snap.digest == digest_of(log[:3]) and snap.meta.term == log[2].term
    resumed = SimStateMachine(snap)
    for entry in log[3 : leader.applied]:
        resumed.apply(entry)
    assert resumed.digest == machine.digest
    with pytest.raises(ValueError):
        resumed.apply(log[0])  # a gap or a repeat is refused


class _KeepNone:
    """A crash that keeps none of the pending writes."""

    def randint(self, low: int, high: int) -> int:
        return low


def _entries(count: int) -> tuple[Entry, ...]:
    return tuple(Entry(i, 1, 1, b"x", 49 * (i - 1)) for i in range(1, count + 1))


def test_disk_compaction_is_durable_and_reads_through_the_snapshot() -> None:
    disk = SimDisk()
    disk.write(HardState(1, 1, 0), _entries(6))
    disk.sync()
    machine = SimStateMachine()
    for entry in _entries(4):
        machine.apply(entry)
    snap = machine.snapshot(4)
    assert disk.compact(snap) and not disk.compact(machine.snapshot(3))
    assert disk.volatile.first_index() == 5 and disk.durable_last() == (1, 6)
    assert disk.durable_term_any(2) == 1 and disk.durable_term(4) == 1
    disk.crash(_KeepNone())  # type: ignore[arg-type]
    assert disk.volatile.first_index() == 5 and disk.volatile_snapshot == snap
    assert [e.index for e in disk.full_log()] == [1, 2, 3, 4, 5, 6]


def test_disk_install_is_atomic_across_a_crash() -> None:
    disk = SimDisk()
    disk.write(HardState(1, 1, 0), _entries(3))
    disk.sync()
    entries = _entries(9)
    snap = SimSnapshot(SnapshotMeta(8, 1, entries[7].end_position), digest_of(entries[:8]),
                       entries[:8])
    disk.install(snap)
    disk.write(HardState(2, 0, 8), entries[8:])
    assert disk.durable_term(8) is None  # not durable yet: an ack now would be early
    disk.crash(_KeepNone())  # type: ignore[arg-type]
    assert disk.volatile.last_index() == 3 and disk.volatile_snapshot is None  # rolled back
    disk.install(snap)
    disk.write(None, entries[8:])
    disk.sync()
    assert disk.durable_term(8) == 1 and disk.durable_last() == (1, 9)
    disk.crash(_KeepNone())  # type: ignore[arg-type]
    assert disk.volatile.first_index() == 9 and disk.volatile.last_index() == 9
