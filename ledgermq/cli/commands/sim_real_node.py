"""`ledgermq sim --real-node`: the real-node simulator (dledger/testing/nodesim).

Not a subcommand of its own: `ledgermq sim` dispatches here when given
`--real-node`. Runs seeds with the broker's apply path (state machine and
ConsumeQueues) on the simulated file system; prints each violation with its
trace tail and the replay command, then a summary (with the counts of
snapshots, compactions, deleted segments and snapshot installs); exit status
1 on any violation.

`--compaction` turns on compaction (dledger/testing/nodesim/compaction.py)
with 4 KiB segments; its state machine must be snapshottable: the broker's
applier is used when it is (`SnapshotApplier`), else the simulator's own
`RecordingApplier` (a hash chain over the applied entries).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace

import typer

COMPACTION_SEGMENT_BYTES = 4096


def run(seed_list: list[int], nodes: int, flush: str, trace: bool, json_output: bool,
        bug: str | None, compaction: bool = False) -> None:
    from rich.console import Console

    from dledger.config import Bugs
    from dledger.testing.nodesim import RUNTIME_BUGS, NodeSimOptions, replay_hint, run_seed
    from dledger.testing.nodesim.apply import ApplierFactory, RecordingApplier, SnapshotApplier
    from ledgermq.broker.nodesim_apply import BrokerApplier
    from ledgermq.cli.commands.sim_output import print_failure

    if flush not in ("sync", "async", "mix"):
        raise typer.BadParameter("--flush must be sync, async or mix")
    runtime_bug = ""
    bugs = Bugs()
    if bug in RUNTIME_BUGS:
        runtime_bug = bug
    elif bug:
        try:
            bugs = Bugs.only(bug)
        except ValueError as exc:
            raise typer.BadParameter(f"{exc}; runtime bugs: {', '.join(RUNTIME_BUGS)}") \
                from exc
    applier: ApplierFactory = BrokerApplier
    if compaction and not issubclass(BrokerApplier, SnapshotApplier):
        applier = RecordingApplier
    options = NodeSimOptions(nodes=nodes, flush=flush, bugs=bugs, runtime_bug=runtime_bug,
                             applier=applier, compaction=compaction)
    if compaction:
        options = replace(options, segment_size=COMPACTION_SEGMENT_BYTES)
    console = Console()
    totals: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    failures = []
    began = time.perf_counter()
    for s in seed_list:
        printer = None
        if trace:
            printer = lambda line, s=s: console.print(f"seed={s} {line}", markup=False)  # noqa: E731
        result = run_seed(s, options, trace=printer)
        modes[result.flush] += 1
        totals["steps"] += result.steps
        totals.update(result.counts)
        if not result.ok:
            failures.append(result)
            if not json_output:
                print_failure(console, result, nodes, trace, replay_hint(s, nodes, compaction))
    elapsed = time.perf_counter() - began
    summary = {
        "simulator": "real-node", "nodes": nodes, "first_seed": seed_list[0],
        "compaction": compaction, "applier": applier.__name__,
        "runs": len(seed_list), "flush_sync": modes["sync"], "flush_async": modes["async"],
        "violations": len(failures), "failed_seeds": [r.seed for r in failures],
        "seconds": round(elapsed, 2),
        "seeds_per_second": round(len(seed_list) / elapsed, 2) if elapsed else 0.0,
        **dict(sorted(totals.items())),
    }
    if json_output:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            console.print(f"{key:>24}  {value}", markup=False)
    raise typer.Exit(1 if failures else 0)
