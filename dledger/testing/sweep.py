"""A seed sweep of the core simulator on several processes, with one summary line.

    python -m dledger.testing.sweep --start 1 --seeds 5000 --nodes 3 \\
        --flush mix --membership 1.0 --procs 2

runs seeds start..start+seeds-1 of `dledger.testing.run_seed` with the given
options, split round-robin over `--procs` worker processes, and prints one
JSON object: runs, violations (with the failing seeds and the first
violations), wall time, seeds per second and the totals of what the runs
did (elections, crashes, compactions, membership changes, wipes, leader
notices...). The
exit status is 1 if any seed found a violation. `ledgermq sim` replays a
single failing seed (`--trace`); this module exists for the long sweeps of
docs/raft.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

from dledger.config import Bugs
from dledger.testing.simulator import SimOptions, run_seed

TOTALS = ("steps", "elections", "crashes", "committed", "compactions", "installs",
          "config_changes", "membership_plans", "membership_plans_done", "membership_refusals",
          "nodes_added", "nodes_removed", "wipes", "repairs", "leader_notices",
          "leader_notices_taken", "leader_notices_wrong", "applied_before_fsync")


def _run(seeds: list[int], options: SimOptions) -> tuple[Counter[str], list[tuple[int, str]]]:
    totals: Counter[str] = Counter()
    failures: list[tuple[int, str]] = []
    for seed in seeds:
        result = run_seed(seed, options)
        totals["runs"] += 1
        totals[f"flush_{result.flush}"] += 1
        totals["membership_runs"] += result.membership
        totals["connection_loss_runs"] += result.connection_loss
        totals["runs_with_stopped_nodes"] += bool(result.stopped)
        for key in TOTALS:
            totals[key] += getattr(result, key)
        if result.violation is not None:
            failures.append((seed, result.violation))
    return totals, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--flush", default="mix", choices=("sync", "async", "mix"))
    parser.add_argument("--membership", type=float, default=SimOptions.membership)
    parser.add_argument("--compaction", type=float, default=SimOptions.compaction)
    parser.add_argument("--connection-loss", type=float, default=SimOptions.connection_loss)
    parser.add_argument("--bug", default=None)
    parser.add_argument("--procs", type=int, default=1)
    args = parser.parse_args(argv)
    options = SimOptions(nodes=args.nodes, flush=args.flush, membership=args.membership,
                         compaction=args.compaction, connection_loss=args.connection_loss,
                         bugs=Bugs.only(args.bug) if args.bug else Bugs())
    seeds = list(range(args.start, args.start + args.seeds))
    procs = max(1, args.procs)
    parts = [seeds[i::procs] for i in range(procs)]
    began = time.perf_counter()
    totals: Counter[str] = Counter()
    failures: list[tuple[int, str]] = []
    if procs == 1:
        totals, failures = _run(seeds, options)
    else:
        with ProcessPoolExecutor(procs) as pool:
            for part_totals, part_failures in pool.map(_run, parts, [options] * procs):
                totals.update(part_totals)
                failures += part_failures
    elapsed = time.perf_counter() - began
    failures.sort()
    summary = {
        "first_seed": args.start, "nodes": args.nodes, "flush": args.flush,
        "membership": args.membership, "compaction": args.compaction,
        "connection_loss": args.connection_loss, "bug": args.bug,
        "procs": procs, **dict(totals), "violations": len(failures),
        "failed_seeds": [seed for seed, _ in failures],
        "first_violations": [f"seed {seed}: {what}" for seed, what in failures[:5]],
        "seconds": round(elapsed, 1),
        "seeds_per_second": round(len(seeds) / elapsed, 2) if elapsed else 0.0,
    }
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
