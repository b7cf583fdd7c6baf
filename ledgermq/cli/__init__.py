"""The `ledgermq` command line: one Typer app, subcommands registered by module."""

from __future__ import annotations

import importlib

import typer

from ledgermq import __version__
from ledgermq.cli.errors import OneLineErrors

app = typer.Typer(
    cls=OneLineErrors,  # expected failures of any command: one line, exit 1
    name="ledgermq",
    help="LedgerMQ: a RocketMQ-style message broker with a Raft-replicated CommitLog.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ledgermq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    # A callback keeps `ledgermq <command>` a command group even while only one
    # command is registered; without it Typer runs that command as the app itself.
    pass


# Modules under ledgermq.cli.commands that each add their subcommands to `app`.
COMMAND_MODULES: tuple[str, ...] = (
    "namesrv",
    "audit",
    "sim",
    "storage_demo",
    "broker",
    "dev",
    "topic",
    "send",
    "consume",
    "status",
    "group",
    "demo",
    "chaos",
    "ping",
    "message",
    "leader",
    "acl",
    "retention",
    "member",
    "node",
    "cluster",
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"ledgermq.cli.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry point."""
    app()

