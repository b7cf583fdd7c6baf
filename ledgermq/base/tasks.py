"""Stopping asyncio tasks without swallowing the caller's own cancellation.

The idiom `task.cancel(); with suppress(CancelledError): await task` has a
trap: if the *caller* is cancelled while it waits, its CancelledError is
suppressed too, so the caller carries on as if nothing happened. A consumer's
rebalance loop that stopped a queue's worker that way kept running after
`stop()` cancelled it, and `stop()` waited for it forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has finished.

    A cancellation of the caller propagates (the tasks stay cancelled). The
    first exception a task ended with, other than its cancellation, is
    raised once all have finished, as awaiting it would have.
    """
    pending = list(tasks)
    for task in pending:
        task.cancel()
    if not pending:
        return
    await asyncio.wait(pending)
    failure: BaseException | None = None
    for task in pending:
        if not task.cancelled() and task.exception() is not None and failure is None:
            failure = task.exception()
    if failure is not None:
        raise failure
