"""Registration with every NameServer.

One loop per NameServer address: connect (and reconnect), send a full
REGISTER_BROKER every `interval`, and at once whenever `kick()` is called (a
role or term change, a topic change). Full registrations instead of
heartbeats keep the NameServer's view fresh even after it restarts, at a cost
of one small request per second per NameServer.

With `credentials` (the cluster key and secret) every connection
authenticates, and a NameServer that does not prove it knows the cluster
secret (one started without it, or an impostor) is not registered with: a
WARNING says so once per NameServer until it does. `tls`: connect with TLS,
verifying the NameServer's certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError, UnauthenticatedError
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.broker.config import split_address
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import Credentials

log = logging.getLogger(__name__)


class Registrar:
    def __init__(self, addresses: tuple[str, ...], registration: Callable[[], dict[str, Any]],
                 interval: float, name: str, *, credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.addresses = addresses
        self.credentials = credentials
        self.tls = tls
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
        warned = False
        try:
            while True:
                kick.clear()
                try:
                    if client is None or client.closed:
                        client = await RpcClient.connect(
                            host, port, role="broker", name=self.name, timeout=3.0,
                            credentials=self.credentials, ssl=self.tls)
                    await client.request(RequestCode.REGISTER_BROKER, self.registration())
                    self.registrations += 1
                    warned = False
                except (UnauthenticatedError, ssl.SSLError) as exc:
                    # A misconfiguration an operator must see, not a blip.
                    if not warned:
                        log.warning("not registering with NameServer %s: %s", address, exc)
                        warned = True
                    if client is not None:
                        await client.close()
                        client = None
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
