"""`ledgermq sim`: run the seeded Raft cluster simulator.

`ledgermq sim --seeds N [--nodes 3|5] [--start S] [--json]` runs seeds
S..S+N-1 and prints a summary; the exit status is 1 if any seed found a
violation. `ledgermq sim --seed S --trace` replays one seed and prints its
event trace (leaders, crashes, partitions, the violation if any).
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
        real_node: bool = typer.Option(
            False, "--real-node", help="Simulate the real node (runtime, storage, apply path)."),
        flush: str = typer.Option("mixed", help="--real-node: flush=sync, async or mixed."),
    ) -> None:
        """Run the deterministic Raft simulator over a range of seeds."""
        import json
        import time

        from rich.console import Console
        from rich.table import Table

        from dledger.config import Bugs
        from dledger.testing import SimOptions, replay_hint, run_seed

        if nodes not in (3, 5):
            raise typer.BadParameter("--nodes must be 3 or 5")
        if real_node:
            from ledgermq.commands import sim_real_node

            sim_real_node.run([seed] if seed is not None else list(range(start, start + seeds)),
                              nodes, flush, trace, json_output, bug)
        try:
            bugs = Bugs.only(bug) if bug else Bugs()
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        console = Console()
        options = SimOptions(nodes=nodes, bugs=bugs)
        seed_list = [seed] if seed is not None else list(range(start, start + seeds))
        totals = dict.fromkeys(
            ("runs", "steps", "elections", "proposals", "committed", "acked", "crashes"), 0
        )
        failures = []
        began = time.perf_counter()
        for s in seed_list:
            printer = None
            if trace:
                printer = lambda line, s=s: console.print(f"seed={s} {line}", markup=False)  # noqa: E731
            result = run_seed(s, options, trace=printer)
            totals["runs"] += 1
            for key in ("steps", "elections", "proposals", "committed", "acked", "crashes"):
                totals[key] += getattr(result, key)
            if not result.ok:
                failures.append(result)
                if not json_output:
                    console.print(f"[bold red]seed={s} nodes={nodes}: {result.violation}[/]")
                    if not trace:
                        for line in result.trace[-25:]:
                            console.print(f"  {line}", markup=False)
                    console.print(f"  {replay_hint(s, nodes)}", markup=False)
        elapsed = time.perf_counter() - began
        summary = {
            "nodes": nodes,
            "first_seed": seed_list[0],
            **totals,
            "violations": len(failures),
            "failed_seeds": [r.seed for r in failures],
            "seconds": round(elapsed, 2),
            "steps_per_second": round(totals["steps"] / elapsed) if elapsed else 0,
        }
        if json_output:
            print(json.dumps(summary))
        else:
            seed_range = f"{seed_list[0]}..{seed_list[-1]}"
            table = Table(title=f"ledgermq sim: {nodes} nodes, seeds {seed_range}")
            table.add_column("metric")
            table.add_column("value", justify="right")
            for key, value in summary.items():
                if key != "failed_seeds":
                    table.add_row(key, str(value))
            console.print(table)
        raise typer.Exit(1 if failures else 0)
