"""Run one broker node until SIGINT/SIGTERM (what `ledgermq broker` calls)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from broker.config import BrokerConfig
from broker.server import Broker


async def serve(config: BrokerConfig, *, stop: asyncio.Event | None = None,
                on_ready: Callable[[str, int], None] | None = None) -> None:
    """Start the broker, report its client address, run until `stop` or a signal."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(config)
    try:
        host, port = await broker.start()
        if on_ready is not None:
            on_ready(host, port)
        await stop.wait()
    finally:
        await broker.stop()
