"""Run one broker node until SIGINT/SIGTERM (what `ledgermq broker` calls)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from ledgermq.base.tasks import cancel_and_wait
from ledgermq.broker.config import BrokerConfig
from ledgermq.broker.server import Broker


async def serve(config: BrokerConfig, *, stop: asyncio.Event | None = None,
                on_ready: Callable[[str, int], None] | None = None) -> bool:
    """Start the broker, report its client address, run until `stop` or a
    signal; True when it stopped because it asked for its own restart (a
    rollback, broker/rollback.py), which the caller carries out."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(config)
    try:
        host, port = await broker.start()
        if on_ready is not None:
            on_ready(host, port)
        stopped = asyncio.ensure_future(stop.wait())
        restart = asyncio.ensure_future(broker.restart_requested.wait())
        try:
            await asyncio.wait({stopped, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait([stopped, restart])
        return broker.restart_requested.is_set() and not stop.is_set()
    finally:
        await broker.stop()
