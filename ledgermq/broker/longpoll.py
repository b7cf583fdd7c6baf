"""Long polling: pulls that found nothing wait for their queue to grow.

The broker calls `notify(keys)` after each dispatch of committed entries; a
waiter wakes when its (topic, queue) got new units or its deadline passes.
One future per waiting queue, replaced after each notification, so a burst of
dispatches costs one wake-up per waiting queue, not one per message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

QueueKey = tuple[str, int]


class LongPoll:
    def __init__(self) -> None:
        self._waiters: dict[QueueKey, asyncio.Future[None]] = {}

    async def wait(self, key: QueueKey, timeout: float) -> bool:
        """Wait until `key` is notified; False on timeout."""
        future = self._waiters.get(key)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiters[key] = future
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(future)
            return True
        return False

    def notify(self, keys: Iterable[QueueKey]) -> None:
        for key in keys:
            future = self._waiters.pop(key, None)
            if future is not None and not future.done():
                future.set_result(None)

    def notify_all(self) -> None:
        self.notify(list(self._waiters))

    @property
    def waiting(self) -> int:
        return len(self._waiters)
