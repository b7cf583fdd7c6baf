"""Simulator throughput and seed sweeps, to size the CI seed budget and run the big sweeps.

Prints one JSON line per configuration: simulated steps and seeds per
second, violations, runs per flush mode and fault profile, runs that
stopped a node (flush=async). `--procs 2` splits the seed range over two
processes (each seed is still a pure function of itself, so the figures
add up to those of one process). Ratios between lines are meaningful on a
shared machine; absolute numbers only on a quiet one. `--compaction SHARE`
(default 0.5) sets the share of seeds with log compaction and snapshot
install; the totals count compactions, installs, snapshot transfers (and
failed ones) and restarts from a snapshot.

    .venv/bin/python bench/sim.py [--runs N] [--nodes 3 5] [--flush sync|async|mix]
                                  [--profile NAME] [--start S] [--procs 1|2]
                                  [--compaction SHARE]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

from dledger.testing import SimOptions, run_seed


def run_range(nodes: int, flush: str, profile: str | None, seeds: range,
              compaction: float = SimOptions.compaction) -> dict[str, object]:
    """Run `seeds` and total them (the unit of work of one process)."""
    options = SimOptions(nodes=nodes, flush=flush, profile=profile, compaction=compaction)
    totals: Counter[str] = Counter()
    failed: list[tuple[int, str, str]] = []
    for seed in seeds:
        result = run_seed(seed, options)
        totals["steps"] += result.steps
        totals["elections"] += result.elections
        totals["committed"] += result.committed
        totals["stopped_runs"] += bool(result.stopped)
        totals["committed_lost"] += result.committed_lost
        totals[f"flush_{result.flush}"] += 1
        totals[f"profile_{result.profile}"] += 1
        totals["figure8_runs"] += result.figure8
        totals["compaction_runs"] += result.compaction
        totals["far_behind_runs"] += result.far_behind
        totals["runs_with_install"] += result.installs > 0
        for key in ("compactions", "installs", "snapshots_sent", "transfer_failures",
                    "snapshot_restarts", "state_divergences"):
            totals[key] += getattr(result, key)
        if not result.ok:
            failed.append((seed, result.flush, result.violation or ""))
    return {"totals": dict(totals), "failed": failed}


def measure(
    nodes: int, runs: int, flush: str, profile: str | None, start: int, procs: int,
    compaction: float = SimOptions.compaction,
) -> dict[str, object]:
    bounds = [start + runs * i // procs for i in range(procs + 1)]
    ranges = [range(bounds[i], bounds[i + 1]) for i in range(procs)]
    began = time.perf_counter()
    if procs == 1:
        parts = [run_range(nodes, flush, profile, ranges[0], compaction)]
    else:
        with ProcessPoolExecutor(procs) as pool:
            futures = [pool.submit(run_range, nodes, flush, profile, r, compaction)
                       for r in ranges]
            parts = [f.result() for f in futures]
    elapsed = time.perf_counter() - began
    totals: Counter[str] = Counter()
    failed: list[tuple[int, str, str]] = []
    for part in parts:
        totals.update(part["totals"])  # type: ignore[call-overload]
        failed.extend(part["failed"])  # type: ignore[arg-type]
    return {
        "bench": "sim",
        "nodes": nodes,
        "flush": flush,
        "profile": profile or "per-seed",
        "compaction": compaction,
        "first_seed": start,
        "runs": runs,
        "procs": procs,
        "seconds": round(elapsed, 2),
        "seeds_per_second": round(runs / elapsed, 2),
        "steps_per_second": round(totals["steps"] / elapsed),
        "steps_per_run": round(totals["steps"] / runs),
        "violations": len(failed),
        "failed": failed[:20],
        **{k: v for k, v in sorted(totals.items()) if k != "steps"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="seeds per configuration")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--flush", default="mix", choices=("sync", "async", "mix"))
    parser.add_argument("--profile", default=None, help="pin one fault profile")
    parser.add_argument("--start", type=int, default=1, help="first seed")
    parser.add_argument("--procs", type=int, default=1, choices=(1, 2))
    parser.add_argument("--compaction", type=float, default=SimOptions.compaction,
                        help="share of seeds with compaction and snapshot install")
    args = parser.parse_args()
    for nodes in args.nodes:
        result = measure(nodes, args.runs, args.flush, args.profile, args.start, args.procs,
                         args.compaction)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
