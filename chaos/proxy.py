"""A per-link userspace TCP proxy: delay, jitter and bandwidth without netem.

This kernel has no netem qdisc, so link shaping happens in userspace, the way
toxiproxy does it. Node A reaches node B's Raft port through a proxy that
listens on A's own address and connects onward *from* A's address, so
iptables rules on the (A, B) address pair still apply to the proxied leg.
Each direction of each connection is a pump that holds every chunk until its
due time (arrival + delay ± jitter, never earlier than the previous chunk:
TCP does not reorder) and paces bytes to the configured rate.

Delay only applies to traffic configured to go through a proxy: the harness
writes the proxy's address into each node's peer list when a shaping nemesis
is selected. Client traffic is never proxied.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from dataclasses import dataclass, field

from ledgermq.base.tasks import cancel_and_wait


@dataclass
class Shape:
    """Per-link shaping; zero values mean no shaping."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    rate_bytes_s: float = 0.0


@dataclass
class Link:
    """One directed link: listen at `listen`, forward to `target` from `source_host`."""

    listen: tuple[str, int]
    target: tuple[str, int]
    source_host: str
    shape: Shape = field(default_factory=Shape)


class LinkProxy:
    """Proxies for a set of links, run on the caller's event loop."""

    def __init__(self, links: list[Link], seed: int = 0) -> None:
        self.links = links
        self.rng = random.Random(seed)
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for link in self.links:
            server = await asyncio.start_server(
                functools.partial(self._accept, link), *link.listen,
                reuse_address=True)
            self._servers.append(server)

    def set_shape(self, listen: tuple[str, int], shape: Shape) -> None:
        for link in self.links:
            if link.listen == listen:
                link.shape = shape

    def clear(self) -> None:
        for link in self.links:
            link.shape = Shape()

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        # A link that failed while closing is of no interest any more; the
        # caller's own cancellation still propagates (cancel_and_wait).
        with contextlib.suppress(Exception):
            await cancel_and_wait(list(self._tasks))
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    async def _accept(self, link: Link, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                async with asyncio.timeout(5.0):
                    up_r, up_w = await asyncio.open_connection(
                        *link.target, local_addr=(link.source_host, 0))
            except (TimeoutError, OSError):
                writer.close()
                return
            pumps = [asyncio.create_task(self._pump(link, reader, up_w)),
                     asyncio.create_task(self._pump(link, up_r, writer))]
            _done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            with contextlib.suppress(Exception):
                await cancel_and_wait(pending)
            for w in (writer, up_w):
                w.close()
        finally:
            self._tasks.discard(task)

    async def _pump(self, link: Link, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
                rate = link.shape.rate_bytes_s
                if rate > 0:
                    await asyncio.sleep(len(chunk) / rate)

        sender = asyncio.create_task(deliver())
        last_due = 0.0
        try:
            while True:
                chunk = await reader.read(65536)
                shape = link.shape
                delay = shape.delay_ms
                if shape.jitter_ms:
                    delay += self.rng.uniform(-shape.jitter_ms, shape.jitter_ms)
                due = max(time.monotonic() + max(delay, 0.0) / 1000, last_due)
                last_due = due
                queue.put_nowait((due, chunk))
                if not chunk:
                    break
            await sender
        finally:
            if not sender.done():
                with contextlib.suppress(Exception):
                    await cancel_and_wait([sender])
