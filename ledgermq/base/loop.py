"""Event loop selection: uvloop when it is installed, asyncio's default otherwise.

Servers and the CLI call `run()` (or `install()` once at start-up) instead of
`asyncio.run`, so the faster loop is used wherever it exists without any code
depending on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop constructor if uvloop imports, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def uvloop_available() -> bool:
    return loop_factory() is not asyncio.new_event_loop


def install() -> bool:
    """Make uvloop the loop for later `asyncio.run` calls; True if it was installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run `main` to completion on a fresh loop (uvloop when available)."""
    with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
        return runner.run(main)
