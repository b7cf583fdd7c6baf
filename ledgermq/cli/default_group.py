"""A command group with a default command: `ledgermq audit SPECS` runs
`ledgermq audit run SPECS`, while `ledgermq audit schedule ...` and
`ledgermq audit cut ...` reach their own subcommands.

Arguments that do not start with a subcommand's name (a directory, an
option such as `--nightly`) are given to the default command, so a command
line that worked before the group existed still does. `--help` alone shows
the group's help with its subcommands. A directory named like a subcommand
is spelled `./cut`.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

DEFAULT_COMMAND = "run"


class DefaultCommandGroup(TyperGroup):
    """`TyperGroup` that puts DEFAULT_COMMAND before arguments naming no subcommand."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)
