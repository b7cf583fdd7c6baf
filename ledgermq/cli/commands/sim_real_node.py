"""`ledgermq sim --real-node`: the real-node simulator (dledger/testing/nodesim).

Not a subcommand of its own: `ledgermq sim` dispatches here when given
`--real-node`. Runs seeds with the broker's apply path (state machine and
ConsumeQueues) on the simulated file system; prints each violation with its
trace tail and the replay command, then a summary (with the counts of
snapshots, compactions, deleted segments and snapshot installs); exit status
1 on any violation.

`--compaction SHARE` turns compaction (dledger/testing/nodesim/compaction.py,
4 KiB segments) on in that share of the seeds (drawn per seed from the seed
alone, so a seed replays alike; 1 = every seed, default 0). Those seeds need
a snapshottable state machine: the broker's applier when it is one
(`SnapshotApplier`), else the simulator's own `RecordingApplier` (a hash
chain over the applied entries); the others run the broker's applier.

`--membership SHARE` turns membership changes on in that share of the seeds
(drawn per seed from the seed alone, independently of compaction; default
0): the group starts with `--nodes` voters and four spare nodes, and while
the faults run an operator adds learners, promotes, removes (the leader too,
after handing leadership over), replaces, grows to five and shrinks to three
voters, and wipes nodes' disks and repairs them (dledger/testing/nodesim/
members.py). The summary then counts the plans by kind and the changes
committed by kind (learners added, promotions, removals, rejoins, repairs).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from dledger.testing.nodesim import NodeSimOptions

COMPACTION_SEGMENT_BYTES = 4096


def compacts(seed: int, share: float) -> bool:
    """Whether `seed` runs with compaction at this share (a function of the seed)."""
    return _drawn(f"compaction-share/{seed}", share)


def changes_members(seed: int, share: float) -> bool:
    """Whether `seed` runs with membership changes at this share (a function of the seed)."""
    return _drawn(f"membership-share/{seed}", share)


def _drawn(stream: str, share: float) -> bool:
    return share >= 1.0 or (share > 0.0 and random.Random(stream).random() < share)


def seed_options(seed: int, base: NodeSimOptions, compaction: float,
                 membership: float) -> NodeSimOptions:
    """What `seed` runs with under these shares (the tests use it too, so a
    seed they pin replays with the command the summary prints)."""
    from dledger.testing.nodesim.apply import RecordingApplier, SnapshotApplier
    from ledgermq.broker.nodesim_apply import BrokerApplier

    options = base
    if compacts(seed, compaction):
        snapshot_applier = BrokerApplier if issubclass(BrokerApplier, SnapshotApplier) \
            else RecordingApplier
        # The broker's applier as given (with its checkpoint rot, if any).
        given = getattr(base.applier, "func", base.applier)
        options = replace(options, compaction=True, segment_size=COMPACTION_SEGMENT_BYTES,
                          applier=base.applier if given is snapshot_applier else snapshot_applier)
    if changes_members(seed, membership):
        options = replace(options, membership=True)
    return options


def run(seed_list: list[int], nodes: int, flush: str, trace: bool, json_output: bool,
        bug: str | None, compaction: float = 0.0, membership: float = 0.0,
        connection_loss: float = 0.5,  # NodeSimOptions.connection_loss
        cq_rot: float = 0.0, reserves: float = 0.0) -> None:
    from rich.console import Console

    from dledger.config import Bugs
    from dledger.testing.nodesim import RUNTIME_BUGS, NodeSimOptions, replay_hint, run_seed
    from dledger.testing.nodesim.apply import RecordingApplier, SnapshotApplier
    from ledgermq.broker.nodesim_apply import BrokerApplier, CheckpointRot
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
    rot = CheckpointRot(cq_rot)
    applier = partial(BrokerApplier, rot=rot) if cq_rot else BrokerApplier
    options = NodeSimOptions(nodes=nodes, flush=flush, bugs=bugs, runtime_bug=runtime_bug,
                             applier=applier, connection_loss=connection_loss,
                             reserves=reserves)
    snapshot_applier = BrokerApplier if issubclass(BrokerApplier, SnapshotApplier) \
        else RecordingApplier
    console = Console()
    totals: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    failures = []
    began = time.perf_counter()
    for s in seed_list:
        printer = None
        if trace:
            printer = lambda line, s=s: console.print(f"seed={s} {line}", markup=False)  # noqa: E731
        chosen = seed_options(s, options, compaction, membership)
        on, members = chosen.compaction, chosen.membership
        result = run_seed(s, chosen, trace=printer)
        totals["compaction_runs"] += on
        totals["membership_runs"] += members
        modes[result.flush] += 1
        totals["steps"] += result.steps
        totals.update(result.counts)
        if not result.ok:
            failures.append(result)
            if not json_output:
                print_failure(console, result, nodes, trace,
                              replay_hint(s, nodes, 1.0 if on else 0.0,
                                          1.0 if members else 0.0, connection_loss, reserves)
                              + (f" --cq-rot {cq_rot}" if cq_rot else ""))
    elapsed = time.perf_counter() - began
    summary = {
        "simulator": "real-node", "nodes": nodes, "first_seed": seed_list[0],
        "compaction": compaction, "compaction_applier": snapshot_applier.__name__,
        "membership": membership, "reserves": reserves, "cq_rot": cq_rot,
        "cq_checkpoints_damaged": rot.damaged,
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
