"""Expected failures as one line on stderr, not a traceback.

An unknown topic, a refused connection or an admin API error answer is
something a user causes and can fix; a traceback hides the one line that
says how. The root command group catches these around every subcommand,
prints `error: <what>` and exits 1. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from ledgermq.base.errors import LedgerMQError
from ledgermq.webadmin.app import AdminApiError

# OSError covers refused connections and timeouts (TimeoutError is one).
EXPECTED: tuple[type[BaseException], ...] = (LedgerMQError, AdminApiError, OSError)


def one_line(exc: BaseException) -> str:
    """The message of an expected failure, on one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError) and exc.strerror:
        return f"{type(exc).__name__}: {text}"
    return text


def fail(message: str) -> typer.Exit:
    """Print `error: message` on stderr; the Exit(1) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


class OneLineErrors(TyperGroup):
    """The root group: expected failures of any subcommand end as one line."""

    # `ctx` is Typer's (vendored) click Context; Any keeps this override
    # independent of where a Typer release takes that class from.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except EXPECTED as exc:
            raise fail(one_line(exc)) from None
