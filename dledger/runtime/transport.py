"""TCP transport between the nodes of one Raft group.

Theory of operation
-------------------
Every node listens on its Raft port and dials each peer twice: one
*control* connection (votes, heartbeats, TimeoutNow) and one *replication*
connection (AppendRequest / AppendResponse). A connection carries traffic in
one direction only (dialer -> listener), so a node's messages to a peer always
leave on its own outgoing connections and its inbound connections are only
read. Two channels per direction mean a heartbeat is never queued behind a
megabyte of appends in a socket buffer (DLedger #63).

Framing is `ledgermq.wire`'s (4-byte length + flags + payload, zstd for
payloads of at least `compress_threshold` (1 MiB) on the replication channel,
which is where large catch-up batches travel). The first frame of a connection is a HELLO
(group, src, dst, channel, see `runtime_codec`); the listener closes the
connection if the group, the sender or the addressee is wrong. Every later
frame is a batch of messages; all messages for one peer and channel produced
by one Ready go out in one `write`.

Failure handling: a malformed frame, a bad handshake or a message whose
sender/addressee contradicts the handshake closes *that* connection only.
Outgoing connections are re-dialled with exponential backoff (20 ms .. 500 ms,
short so a restarted node is reached quickly); while a link is down its
messages are dropped, which Raft tolerates (appends are re-sent after
`resend_ticks`, heartbeats every interval). A replication link whose socket
buffer exceeds `replication_buffer_max` also drops, bounding memory when a
follower stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from dledger.messages import CHANNEL_CONTROL, CHANNEL_REPLICATION, Message
from dledger.runtime.codec import (
    HELLO_BYTES_MAX,
    CodecError,
    decode_batch,
    decode_hello,
    encode_batches,
    encode_hello,
)
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire.codec import encode_frame
from ledgermq.wire.streams import read_frame

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# Messages are cut into frames of about this many bytes (before compression).
FRAME_PAYLOAD_BYTES = 4 * 1024 * 1024
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 0.5
CONNECT_TIMEOUT_S = 2.0
# Replication payloads are compressed from this size on: catch-up batches.
# A steady-state Ready (tens to hundreds of KiB) is cheaper to send as is on
# loopback or a LAN: zstd costs ~20-40 us to compress and up to ~70 us to
# decompress per 100 KiB, a loopback send ~20 us of kernel time.
REPLICATION_COMPRESS_THRESHOLD = 1024 * 1024

Deliver = Callable[[list[Message]], None]


class _Link:
    """One outgoing connection to a peer for one channel, re-dialled forever."""

    def __init__(self, transport: PeerTransport, peer: int, channel: str,
                 address: tuple[str, int]) -> None:
        self.transport = transport
        self.peer = peer
        self.channel = channel
        self.address = address
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.connects = 0
        self.dropped = 0
        self.frames = 0
        self.bytes = 0
        self.compress_threshold = (
            transport.compress_threshold if channel == CHANNEL_REPLICATION else None
        )

    def send(self, messages: Sequence[Message]) -> None:
        writer = self.writer
        if writer is None or writer.is_closing():
            self.dropped += len(messages)
            return
        limit = self.transport.replication_buffer_max
        if (self.channel == CHANNEL_REPLICATION
                and writer.transport.get_write_buffer_size() > limit):
            self.dropped += len(messages)
            return
        frames = [encode_frame(p, compress_threshold=self.compress_threshold)
                  for p in encode_batches(messages, FRAME_PAYLOAD_BYTES)]
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        writer.write(data)
        self.frames += len(frames)
        self.bytes += len(data)

    async def run(self) -> None:
        t = self.transport
        backoff = BACKOFF_MIN_S
        loop = asyncio.get_running_loop()
        while not t.closing:
            local = (t.bind_host, 0) if t.bind_host else None
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    reader, writer = await asyncio.open_connection(*self.address,
                                                                   local_addr=local)
            except (OSError, TimeoutError):
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            writer.write(encode_frame(encode_hello(t.group, t.node_id, self.peer, self.channel),
                                      compress_threshold=None))
            self.writer = writer
            self.connects += 1
            started = loop.time()
            try:
                # The peer never writes on this connection: any read result
                # (EOF, data, reset) means the connection is over.
                await reader.read(1)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                self.writer = None
                writer.close()
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await writer.wait_closed()
            if loop.time() - started > 1.0:
                backoff = BACKOFF_MIN_S
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class PeerTransport:
    """Listener plus one control and one replication link per peer."""

    def __init__(
        self,
        group: str,
        node_id: int,
        peers: dict[int, tuple[str, int]],
        deliver: Deliver,
        *,
        bind_host: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        compress_threshold: int | None = REPLICATION_COMPRESS_THRESHOLD,
        replication_buffer_max: int = 32 * 1024 * 1024,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.group = group
        self.node_id = node_id
        self.peers = dict(peers)
        self.deliver = deliver
        self.bind_host = bind_host
        self.max_frame_bytes = max_frame_bytes
        self.compress_threshold = compress_threshold
        self.replication_buffer_max = replication_buffer_max
        self.handshake_timeout = handshake_timeout
        self.closing = False
        self._server: asyncio.Server | None = None
        self._links: dict[tuple[int, str], _Link] = {
            (peer, channel): _Link(self, peer, channel, address)
            for peer, address in self.peers.items() if peer != node_id
            for channel in (CHANNEL_CONTROL, CHANNEL_REPLICATION)
        }
        self._inbound: set[asyncio.Task[None]] = set()
        self._inbound_writers: set[asyncio.StreamWriter] = set()
        self.frames_received = 0
        self.messages_received = 0
        self.rejected_connections = 0
        self.accepted_connections = 0

    async def start(self) -> tuple[str, int]:
        host, port = self.peers[self.node_id]
        self._server = await asyncio.start_server(self._on_connect, host, port,
                                                  reuse_address=True)
        for link in self._links.values():
            link.task = asyncio.get_running_loop().create_task(
                link.run(), name=f"raft-link-{self.node_id}->{link.peer}-{link.channel}")
        bound: tuple[str, int] = self._server.sockets[0].getsockname()[:2]
        return bound

    def send(self, messages: Sequence[Message]) -> None:
        """Send a Ready's messages: one write per (peer, channel) link."""
        if not messages:
            return
        if len(messages) == 1:
            msg = messages[0]
            link = self._links.get((msg.dst, msg.channel))
            if link is not None:
                link.send(messages)
            return
        groups: dict[tuple[int, str], list[Message]] = {}
        for msg in messages:
            groups.setdefault((msg.dst, msg.channel), []).append(msg)
        for key, batch in groups.items():
            link = self._links.get(key)
            if link is not None:
                link.send(batch)

    def connected(self, peer: int) -> bool:
        return all(self._links[(peer, ch)].writer is not None
                   for ch in (CHANNEL_CONTROL, CHANNEL_REPLICATION))

    async def close(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        tasks: list[asyncio.Task[Any]] = []
        for link in self._links.values():
            link.close()
            if link.task is not None:
                link.task.cancel()
                tasks.append(link.task)
        for writer in list(self._inbound_writers):
            writer.close()
        tasks += list(self._inbound)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(OSError):
                await self._server.wait_closed()

    def stats(self) -> dict[str, Any]:
        links = {
            f"{peer}/{channel}": {"connected": link.writer is not None, "connects": link.connects,
                                  "frames": link.frames, "bytes": link.bytes,
                                  "dropped": link.dropped}
            for (peer, channel), link in sorted(self._links.items())
        }
        return {"links": links, "frames_received": self.frames_received,
                "messages_received": self.messages_received,
                "accepted_connections": self.accepted_connections,
                "rejected_connections": self.rejected_connections}

    # ------------------------------------------------------------- inbound

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.closing or task is None:
            writer.close()
            return
        self._inbound.add(task)
        self._inbound_writers.add(writer)
        try:
            await self._serve(reader, writer)
        finally:
            self._inbound.discard(task)
            self._inbound_writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(self.handshake_timeout):
                payload = await read_frame(reader, HELLO_BYTES_MAX)
            if payload is None:
                return
            hello = decode_hello(payload)
            src = hello["src"]
            if hello["group"] != self.group:
                raise CodecError(f"peer of group {hello['group']!r} connected to {self.group!r}")
            if hello["dst"] != self.node_id or src == self.node_id or src not in self.peers:
                raise CodecError(f"handshake from {src} to {hello['dst']} reached {self.node_id}")
        except (CodecError, LedgerMQError, TimeoutError, OSError,
                asyncio.IncompleteReadError) as exc:
            self.rejected_connections += 1
            log.warning("raft %s/%d: rejected connection from %s: %s", self.group, self.node_id,
                        peername, exc)
            return
        self.accepted_connections += 1
        try:
            while not self.closing:
                payload = await read_frame(reader, self.max_frame_bytes)
                if payload is None:
                    return
                messages = decode_batch(payload, self.max_frame_bytes)
                for msg in messages:
                    if msg.src != src or msg.dst != self.node_id:
                        raise CodecError(f"message {msg.src}->{msg.dst} on link {src}->"
                                         f"{self.node_id}")
                self.frames_received += 1
                self.messages_received += len(messages)
                self.deliver(messages)
        except (CodecError, LedgerMQError) as exc:
            self.rejected_connections += 1
            log.warning("raft %s/%d: closing connection from node %d: %s", self.group,
                        self.node_id, src, exc)
        except (OSError, asyncio.IncompleteReadError):
            return
