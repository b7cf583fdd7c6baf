"""What both simulators' commands print for a failing seed (`ledgermq sim`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def print_failure(console: Console, result: Any, nodes: int, traced: bool, hint: str) -> None:
    """The violation, the last 25 trace lines (unless the whole trace was
    printed already) and the command that replays the seed."""
    console.print(f"[bold red]seed={result.seed} nodes={nodes} flush={result.flush}: "
                  f"{result.violation}[/]")
    if not traced:
        for line in result.trace[-25:]:
            console.print(f"  {line}", markup=False)
    console.print(f"  {hint}", markup=False)
