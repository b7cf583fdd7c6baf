"""CI seed budget for the simulator: a fixed seed list plus fresh random seeds.

Fresh seeds are printed (run pytest with -s or look at the failure message)
so a failure can be replayed with `ledgermq sim --seed S --nodes N --trace`.
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
# Fresh seeds that once failed, kept for good: (seed, nodes, what it found).
REGRESSIONS = [
    (1638280297, 3, "liveness: a stale candidate reset the others' election timers"),
]


def run_many(seeds: list[int], nodes: int) -> None:
    options = SimOptions(nodes=nodes)
    for seed in seeds:
        result = run_seed(seed, options)
        if not result.ok:
            trace = "\n".join(result.trace[-30:])
            pytest.fail(
                f"seed={seed} nodes={nodes}: {result.violation}\n{trace}\n"
                f"{replay_hint(seed, nodes)}"
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


@pytest.mark.parametrize(("seed", "nodes", "found"), REGRESSIONS, ids=lambda v: str(v))
def test_regression_seeds(seed: int, nodes: int, found: str) -> None:
    run_many([seed], nodes)


def test_fresh_random_seeds() -> None:
    rng = random.Random()
    fresh3 = [rng.randrange(1, 2**31) for _ in range(FRESH_3)]
    fresh5 = [rng.randrange(1, 2**31) for _ in range(FRESH_5)]
    print(f"fresh seeds (3 nodes): {fresh3}")
    print(f"fresh seeds (5 nodes): {fresh5}")
    run_many(fresh3, 3)
    run_many(fresh5, 5)


def test_replay_is_exact() -> None:
    a = run_seed(12345, SimOptions(nodes=5))
    lines: list[str] = []
    b = run_seed(12345, SimOptions(nodes=5), trace=lines.append)
    assert (a.steps, a.elections, a.committed, a.violation) == (
        b.steps, b.elections, b.committed, b.violation,
    )
    assert lines, "trace callback saw no events"
