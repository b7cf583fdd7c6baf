"""Simulator throughput, to size the CI seed budget.

Prints one JSON line per configuration (3 and 5 nodes): simulated steps per
second and runs per second over a fixed seed range. Ratios between lines are
meaningful on a shared machine; absolute numbers only on a quiet one.

    .venv/bin/python bench/sim.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import time

from dledger.testing import SimOptions, run_seed


def measure(nodes: int, runs: int) -> dict[str, object]:
    options = SimOptions(nodes=nodes)
    steps = elections = committed = violations = 0
    began = time.perf_counter()
    for seed in range(1, runs + 1):
        result = run_seed(seed, options)
        steps += result.steps
        elections += result.elections
        committed += result.committed
        violations += 0 if result.ok else 1
    elapsed = time.perf_counter() - began
    return {
        "bench": "sim",
        "nodes": nodes,
        "runs": runs,
        "steps": steps,
        "seconds": round(elapsed, 3),
        "steps_per_second": round(steps / elapsed),
        "runs_per_second": round(runs / elapsed, 2),
        "steps_per_run": round(steps / runs),
        "elections": elections,
        "proposals_committed": committed,
        "violations": violations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="seeds per configuration")
    args = parser.parse_args()
    for nodes in (3, 5):
        print(json.dumps(measure(nodes, args.runs)), flush=True)


if __name__ == "__main__":
    main()
