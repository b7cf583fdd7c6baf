"""Registration with every NameServer.

One loop per NameServer address: connect (and reconnect), send a full
REGISTER_BROKER every `interval`, and at once whenever `kick()` is called (a
role or term change, a topic change). Full registrations instead of
heartbeats keep the NameServer's view fresh even after it restarts, at a cost
of one small request per second per NameServer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.broker.config import split_address
from ledgermq.wire import RpcClient

log = logging.getLogger(__name__)


class Registrar:
    def __init__(self, addresses: tuple[str, ...], registration: Callable[[], dict[str, Any]],
                 interval: float, name: str) -> None:
        self.addresses = addresses
        self.registration = registration
        self.interval = interval
        self.name = name
        self._kicks = [asyncio.Event() for _ in addresses]
        self._tasks: list[asyncio.Task[None]] = []
        self.registrations = 0

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(a, k))
                       for a, k in zip(self.addresses, self._kicks, strict=True)]

    def kick(self) -> None:
        for event in self._kicks:
            event.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)

    async def _loop(self, address: str, kick: asyncio.Event) -> None:
        host, port = split_address(address)
        client: RpcClient | None = None
        try:
            while True:
                kick.clear()
                try:
                    if client is None or client.closed:
                        client = await RpcClient.connect(host, port, role="broker",
                                                         name=self.name, timeout=3.0)
                    await client.request(RequestCode.REGISTER_BROKER, self.registration())
                    self.registrations += 1
                except (LedgerMQError, OSError, ConnectionError) as exc:
                    log.debug("register with %s failed: %s", address, exc)
                    if client is not None:
                        await client.close()
                        client = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await kick.wait()
        finally:
            if client is not None:
                await client.close()
