"""Output of the read commands: rich tables for people, `-o json` for scripts.

With `-o json` a command writes one JSON document on stdout and nothing else
(errors still go to stderr), so `ledgermq status -o json | jq ...` works.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table


class Output(enum.StrEnum):
    table = "table"
    json = "json"


OUTPUT_OPTION = typer.Option(Output.table, "--output", "-o",
                             help="table (for people) or json (for scripts).")


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def table(title: str, columns: tuple[str, ...], *, keep: tuple[str, ...] = ()) -> Table:
    """A table that fits 80 columns without losing what matters: the columns
    named in `keep` (addresses, roles, names) are never wrapped or cut; the
    others wrap or fold their cells instead of eliding them."""
    from rich import box

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              show_edge=False)
    for column in columns:
        if column in keep:
            t.add_column(column, no_wrap=True, overflow="fold")
        else:
            t.add_column(column, overflow="fold")
    return t


def console() -> Console:
    return Console(highlight=False)
