"""``ledgermq audit``: the Spark consistency audit of replicas and client histories."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the ``audit`` subcommand to the ledgermq CLI."""

    @app.command("audit")
    def audit(
        group_specs: Annotated[list[str], typer.Argument(
            help="NAME=DIR,DIR,... or a ROOT/<group>/<node>/ directory (paths or URIs)")],
        master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
        out: Annotated[str, typer.Option(help="output directory")] = "audit-out",
        history: Annotated[list[str] | None, typer.Option(
            help="client history.jsonl (repeatable)")] = None,
        engine: Annotated[str, typer.Option(
            help="spark, or python (in-process, local paths only)")] = "spark",
        driver_memory: Annotated[str, typer.Option(help="Spark driver memory")] = "4g",
        progress: Annotated[bool, typer.Option(help="Spark console progress bar")] = True,
        max_entry_size: Annotated[int, typer.Option(
            help="the brokers' entry_size_bytes_max")] = 64 * 1024 * 1024,
        segment_size: Annotated[int, typer.Option(
            help="segment_size_bytes (0: inferred from segment names)")] = 0,
    ) -> None:
        """Cross-check every replica's files and the client histories; exit 1 on failure."""
        from spark_audit.cli import run

        raise typer.Exit(run(group_specs, out=out, master=master, history=history or [],
                             engine=engine, driver_memory=driver_memory, progress=progress,
                             max_entry_size=max_entry_size, segment_size=segment_size))
