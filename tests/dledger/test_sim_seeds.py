"""CI seed budget for the simulator: a fixed seed list plus fresh random seeds.

Fresh seeds are printed (run pytest with -s or look at the failure message)
so a failure can be replayed with `ledgermq sim --seed S --nodes N --flush F --trace`.
Seeds run with flush="mix": each seed draws its fault profile and, in about
30% of seeds, flush=async (`dledger.testing.simulator.ASYNC_SHARE`), and in
about half of them compaction and snapshot install (`SimOptions.compaction`;
tests/dledger/test_sim_snapshots.py runs every seed with it).
Budget measured on the 2-core CI machine: see docs/raft.md.
"""

from __future__ import annotations

import random

import pytest

from dledger.testing import SimOptions, replay_hint, run_seed

FIXED_3 = range(1, 401)
FIXED_5 = range(1, 201)
FRESH_3 = 60
FRESH_5 = 30
CHUNK = 50
# Seeds that once failed, kept for good: (seed, nodes, flush, what it found).
# The first one predates fault profiles; it now replays other faults.
REGRESSIONS = [
    (1638280297, 3, "mix", "liveness: a stale candidate reset the others' election timers"),
    (60, 5, "sync", "slow fsync: an ack made in term 7 left after a term-9 leader cut the entry"),
    (73, 3, "async", "stuck follower: it lost its acked tail, the leader probed above its end"),
    (201, 3, "async", "lost acked tail re-anchored at the follower's commit: replicas differ"),
    (1003982, 3, "mix", "checker: a late term-24 winner need not hold an entry committed in 26"),
    (167, 3, "sync", "liveness budget: ~60 entries behind slow_disk fsyncs, one per round"),
    (2098137257, 5, "mix", "harness: decommissioned a voter whose removal flush=async had lost"),
    (90121, 5, "async", "harness: the only quorum left after the heal needed a removed node"),
]


def run_many(seeds: list[int], nodes: int, flush: str = "mix") -> None:
    options = SimOptions(nodes=nodes, flush=flush)
    for seed in seeds:
        result = run_seed(seed, options)
        if not result.ok:
            trace = "\n".join(result.trace[-30:])
            pytest.fail(
                f"seed={seed} nodes={nodes} flush={flush}: {result.violation}\n{trace}\n"
                f"{replay_hint(seed, nodes, flush)}"
            )


def chunks(seeds: range) -> list[list[int]]:
    values = list(seeds)
    return [values[i : i + CHUNK] for i in range(0, len(values), CHUNK)]


@pytest.mark.parametrize("seeds", chunks(FIXED_3), ids=lambda s: f"{s[0]}-{s[-1]}")
def test_fixed_seeds_3_nodes(seeds: list[int]) -> None:
    run_many(seeds, 3)


@pytest.mark.parametrize("seeds", chunks(FIXED_5), ids=lambda s: f"{s[0]}-{s[-1]}")
def test_fixed_seeds_5_nodes(seeds: list[int]) -> None:
    run_many(seeds, 5)


@pytest.mark.parametrize(("seed", "nodes", "flush", "found"), REGRESSIONS, ids=lambda v: str(v))
def test_regression_seeds(seed: int, nodes: int, flush: str, found: str) -> None:
    run_many([seed], nodes, flush)


def test_async_mode_runs_and_stops_nodes_that_lost_committed_data() -> None:
    """flush=async loses acked tails on crashes; some runs stop a node for it, none fail."""
    stopped = 0
    for seed in range(1, 61):
        result = run_seed(seed, SimOptions(nodes=3, flush="async"))
        assert result.ok, f"seed={seed}: {result.violation}\n{replay_hint(seed, 3, 'async')}"
        assert result.flush == "async"
        stopped += bool(result.stopped)
        for reason in result.stopped.values():
            assert "diverged" in reason
    assert stopped > 0, "no async run lost committed data: the async model does not bite"


def test_fresh_random_seeds() -> None:
    rng = random.Random()
    fresh3 = [rng.randrange(1, 2**31) for _ in range(FRESH_3)]
    fresh5 = [rng.randrange(1, 2**31) for _ in range(FRESH_5)]
    print(f"fresh seeds (3 nodes): {fresh3}")
    print(f"fresh seeds (5 nodes): {fresh5}")
    run_many(fresh3, 3)
    run_many(fresh5, 5)


def test_replay_is_exact() -> None:
    a = run_seed(12345, SimOptions(nodes=5, flush="mix"))
    lines: list[str] = []
    b = run_seed(12345, SimOptions(nodes=5, flush="mix"), trace=lines.append)
    assert (a.steps, a.elections, a.committed, a.violation) == (
        b.steps, b.elections, b.committed, b.violation,
    )
    assert lines, "trace callback saw no events"


def test_a_group_still_catching_up_gets_another_liveness_window() -> None:
    """A group still catching up when its liveness window ends gets another:
    the window is extended while some node still progresses (a group that
    stops converging is still reported: the bug switches' tests). Seed 167
    needed it with the default window until a leader stopped waiting for its
    own fsync before its next Ready (issue 18) and caught up sooner; no seed
    of 1,500 needs it now, so this one runs with a window of 1,000 units
    (slow_disk: a lagging node gains one entry per round behind its fsyncs)."""
    traced: list[str] = []
    result = run_seed(51, SimOptions(flush="sync", liveness_phase_units=1000),
                      trace=traced.append)
    assert result.ok, result.violation
    assert any("window extended" in line for line in traced)


@pytest.mark.parametrize(("nodes", "seeds"), [(3, range(1, 151)), (5, range(1, 81))])
def test_seeds_with_reserves(nodes: int, seeds: range) -> None:
    """Every seed with the leaders batching their reserves' entries (RaftNode
    rule 8, on in the runtime), in batches of 2 or 8."""
    options = SimOptions(nodes=nodes, flush="mix", reserves=1.0)
    for seed in seeds:
        result = run_seed(seed, options)
        assert result.reserve_batch in (2, 8)
        assert result.ok, (f"seed={seed}: {result.violation}\n"
                           f"{replay_hint(seed, nodes, 'mix', reserves=1.0)}")
