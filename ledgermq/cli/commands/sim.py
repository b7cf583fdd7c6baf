"""`ledgermq sim`: run the seeded Raft cluster simulator.

`ledgermq sim --seeds N [--nodes 3|5] [--start S] [--json]` runs seeds
S..S+N-1 and prints a summary; the exit status is 1 if any seed found a
violation. `ledgermq sim --seed S --trace` replays one seed and prints its
event trace (leaders, crashes, partitions, the violation if any).
`--flush sync|async|mix` picks the durability model (mix: async in about 30%
of seeds) and `--profile NAME` pins one fault profile instead of drawing
one per seed (dledger/testing/faults.py). `--compaction SHARE` sets the share
of seeds where nodes compact their logs and followers install snapshots
(default 0.5; with `--real-node` default 0, see `sim_real_node`; the summary
counts compactions, installs, snapshot transfers and restarts from a
snapshot); `--install-mutant stale_state` breaks the simulated install on
purpose. `--membership SHARE` (default 0.5 for the core simulator, 0 with
`--real-node`) sets the share of seeds where an operator adds, promotes,
removes and replaces nodes and wipes and repairs disks while the faults run
(the summary counts configuration changes, wipes and repairs). `--cq-rot
SHARE` (`--real-node` only, default 0) damages the ConsumeQueue dispatch
checkpoint before that share of restarts (`nodesim_apply.CheckpointRot`).
`--reserves SHARE` (default 0) sets the share of seeds whose leaders batch
the entries of the followers their commit does not need (RaftNode rule 8,
on in the runtime's defaults; 0 replays every seed as before it existed).
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("sim")
    def sim(
        seeds: int = typer.Option(100, min=1, help="How many seeds to run."),
        nodes: int = typer.Option(3, help="Nodes per simulated group: 3 or 5."),
        start: int = typer.Option(1, help="First seed of the range."),
        seed: int | None = typer.Option(None, help="Run this one seed only."),
        trace: bool = typer.Option(False, help="Print the event trace of each run."),
        json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        bug: str | None = typer.Option(None, help="Switch on one injected bug (see docs/raft.md)."),
        flush: str | None = typer.Option(
            None, help="Durability model: sync, async or mix (default: sync for the core "
                       "simulator, mix for --real-node)."),
        profile: str | None = typer.Option(
            None, help="Pin one fault profile (default: drawn per seed)."
        ),
        real_node: bool = typer.Option(
            False, "--real-node", help="Simulate the real node (runtime, storage, apply path)."),
        compaction: float | None = typer.Option(
            None, min=0.0, max=1.0,
            help="Share of seeds with log compaction and snapshot install (default 0.5 for the "
                 "core simulator, 0 for --real-node)."),
        install_mutant: str | None = typer.Option(
            None, help="Break the simulated snapshot install on purpose: stale_state."),
        membership: float | None = typer.Option(
            None, min=0.0, max=1.0,
            help="Share of seeds with membership changes and disk wipes (default 0.5 for the "
                 "core simulator, 0 for --real-node)."),
        connection_loss: float = typer.Option(
            0.5, min=0.0, max=1.0,
            help="Share of seeds in which followers are told their leader's connections "
                 "closed (real and wrong notices; docs/raft.md, leader connection loss)."),
        reserves: float = typer.Option(
            0.0, min=0.0, max=1.0,
            help="Share of seeds whose leaders send the followers their commit does not need "
                 "new entries in batches (docs/raft.md, reserves; on in the runtime)."),
        cq_rot: float = typer.Option(
            0.0, min=0.0, max=1.0,
            help="--real-node: share of restarts whose ConsumeQueue checkpoint is damaged "
                 "before recovery (flipped, torn, emptied)."),
    ) -> None:
        """Run the deterministic Raft simulator over a range of seeds."""
        import json
        import time
        from collections import Counter

        from rich.console import Console
        from rich.table import Table

        from dledger.config import Bugs
        from dledger.testing import SimOptions, replay_hint, run_seed
        from ledgermq.cli.commands.sim_output import print_failure

        if nodes not in (3, 5):
            raise typer.BadParameter("--nodes must be 3 or 5")
        if real_node:
            from ledgermq.cli.commands import sim_real_node

            sim_real_node.run([seed] if seed is not None else list(range(start, start + seeds)),
                              nodes, flush or "mix", trace, json_output, bug, compaction or 0.0,
                              membership or 0.0, connection_loss, cq_rot, reserves)
        flush = flush or "sync"
        try:
            bugs = Bugs.only(bug) if bug else Bugs()
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        console = Console()
        try:
            options = SimOptions(nodes=nodes, bugs=bugs, flush=flush, profile=profile,
                                 compaction=0.5 if compaction is None else compaction,
                                 membership=0.5 if membership is None else membership,
                                 install_mutant=install_mutant,
                                 connection_loss=connection_loss, reserves=reserves)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        seed_list = [seed] if seed is not None else list(range(start, start + seeds))
        counted = ("steps", "elections", "proposals", "committed", "acked", "crashes",
                   "compactions", "installs", "snapshots_sent", "transfer_failures",
                   "snapshot_restarts", "config_changes", "wipes", "repairs", "nodes_added",
                   "nodes_removed", "applied_before_fsync")
        totals = dict.fromkeys(("runs", *counted, "compaction_runs", "runs_with_install",
                                "reserve_runs"), 0)
        failures = []
        modes: Counter[str] = Counter()
        profiles: Counter[str] = Counter()
        stopped_runs = 0
        began = time.perf_counter()
        for s in seed_list:
            printer = None
            if trace:
                printer = lambda line, s=s: console.print(f"seed={s} {line}", markup=False)  # noqa: E731
            result = run_seed(s, options, trace=printer)
            totals["runs"] += 1
            for key in counted:
                totals[key] += getattr(result, key)
            totals["compaction_runs"] += result.compaction
            totals["runs_with_install"] += result.installs > 0
            totals["reserve_runs"] += result.reserve_batch > 0
            modes[result.flush] += 1
            profiles[result.profile] += 1
            stopped_runs += bool(result.stopped)
            if not result.ok:
                failures.append(result)
                if not json_output:
                    hint = replay_hint(s, nodes, flush, compaction, membership, connection_loss,
                                       reserves)
                    if install_mutant:
                        hint += f" --install-mutant {install_mutant}"
                    print_failure(console, result, nodes, trace, hint)
        elapsed = time.perf_counter() - began
        summary = {
            "nodes": nodes,
            "first_seed": seed_list[0],
            **totals,
            "violations": len(failures),
            "failed_seeds": [r.seed for r in failures],
            "seconds": round(elapsed, 2),
            "steps_per_second": round(totals["steps"] / elapsed) if elapsed else 0,
            "seeds_per_second": round(totals["runs"] / elapsed, 2) if elapsed else 0,
            "sync_runs": modes["sync"],
            "async_runs": modes["async"],
            "runs_with_stopped_nodes": stopped_runs,
            "profiles": dict(sorted(profiles.items())),
        }
        if json_output:
            print(json.dumps(summary))
        else:
            seed_range = f"{seed_list[0]}..{seed_list[-1]}"
            table = Table(title=f"ledgermq sim: {nodes} nodes, seeds {seed_range}")
            table.add_column("metric")
            table.add_column("value", justify="right")
            for key, value in summary.items():
                if key not in ("failed_seeds", "profiles"):
                    table.add_row(key, str(value))
            console.print(table)
        raise typer.Exit(1 if failures else 0)
