"""Subcommands of the `ledgermq` CLI, one module each.

Each module defines `register(app: typer.Typer) -> None`; `ledgermq.cli`
calls it. Keeping them apart keeps heavy imports (PySpark, asyncio servers)
out of commands that do not need them: modules import their dependencies
inside the command functions.
"""
