"""The checker bites: each injected bug is found by the simulator within a bounded seed budget.

Each bug is switched on alone; the simulator must report a violation within
`SEED_BUDGET` seeds, and replaying the failing seed must reproduce the same
violation (a failure is useless if it cannot be replayed).
"""

from __future__ import annotations

import pytest

from dledger.config import Bugs
from dledger.testing import SimOptions, run_seed

SEED_BUDGET = 100


@pytest.mark.parametrize("bug", Bugs.names())
def test_simulator_finds_bug(bug: str) -> None:
    options = SimOptions(nodes=3, bugs=Bugs.only(bug))
    for seed in range(1, SEED_BUDGET + 1):
        result = run_seed(seed, options)
        if not result.ok:
            print(f"{bug}: found at seed {seed}: {result.violation}")
            again = run_seed(seed, options)
            assert again.violation == result.violation and again.steps == result.steps
            return
    pytest.fail(f"bug {bug!r} not detected in {SEED_BUDGET} seeds")


def test_no_bugs_is_the_default() -> None:
    assert not any(getattr(Bugs(), name) for name in Bugs.names())
    with pytest.raises(ValueError):
        Bugs.only("no_such_bug")
