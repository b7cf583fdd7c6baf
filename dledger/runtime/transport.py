"""TCP transport between the nodes of one Raft group.

Theory of operation
-------------------
Every node listens on its Raft port and dials each peer twice: one
*control* connection (votes, heartbeats, TimeoutNow) and one *replication*
connection (AppendRequest / AppendResponse). After the handshake a
connection carries traffic in one direction only (dialer -> listener), so a
node's messages to a peer always leave on its own outgoing connections and
its inbound connections are only read. Two channels per direction mean a
heartbeat is never queued behind a megabyte of appends in a socket buffer
(DLedger #63).

Framing is `ledgermq.wire`'s (4-byte length + flags + payload, zstd for
payloads of at least `compress_threshold` (1 MiB) on the replication channel,
which is where large catch-up batches travel). The first frame of a connection is a HELLO
(group, src, dst, channel, see `runtime_codec`); the listener closes the
connection if the group, the sender or the addressee is wrong. Every later
frame is a batch of messages; all messages for one peer and channel produced
by one Ready go out in one `write`.

Peer authentication (docs/raft.md, "Peer authentication"): with a cluster
secret, the HELLO carries the dialer's nonce, the listener answers with a
fresh challenge and its proof of the secret over (challenge, nonce, claim),
and the dialer, once it has checked that proof, sends its own; the claim
binds the group, both node ids and the channel. Nothing is read as a Raft
message, and nothing is sent, before the handshake succeeded. With TLS
contexts the connection is TLS from its first byte; the event loop runs the
listener's TLS handshake (within `handshake_timeout`) before the connection
reaches this module. (Upgrading after accepting, so the caps below would
cover the TLS handshake too, loses the ClientHello under uvloop, see
MagicStack/uvloop#707.) A group without a secret speaks the handshake of
before (HELLO only, the listener never writes).

Bounded resources: a connection still in its handshake holds one slot of at
most `max_pending_per_address` per source address and `max_pending` overall
(the oldest is closed to admit a new one, so a slow or silent client cannot
lock legitimate peers out for longer than their handshake takes) and must
finish within `handshake_timeout`; it reads only frames of up to
`HELLO_BYTES_MAX`. An authenticated connection replaces the previous one of
the same peer and channel, so at most two per peer exist.

Membership: the peers are not fixed. `set_peers` makes the links match a
new address map (the members of the configuration in effect, which the
node computes whenever a CONFIG entry is appended or truncated): new peers
are dialled, a peer whose address changed is re-dialled there, and a peer
no longer listed is dropped (`remove_peer`: its links stop re-dialling,
their sockets are aborted with whatever was still buffered for them,
messages to it are dropped and counted as `unroutable`, and its inbound
connections are closed). An inbound HELLO is accepted from a listed peer,
or from a node the node's `accept_peer(node_id)` predicate admits (e.g. a
member this node's configuration does not list yet); anything else is
refused as `unknown_peer`. Every HELLO carries its sender's own address
(`advertise`): when an admitted node is not listed, the transport dials it
back there (a *learned* peer), so a follower whose configuration is older
than its leader can still answer it; a learned peer stays while
`accept_peer` admits it and is dropped by `remove_peer`, or by `set_peers`
once the predicate refuses it.

Failure handling: a malformed frame, a bad handshake or a message whose
sender/addressee contradicts the handshake closes *that* connection only;
a refused handshake is logged as one WARNING line (rate-limited) and counted
by reason (`auth_failures`, `on_auth_failure`).
Outgoing connections are re-dialled with exponential backoff (20 ms .. 500 ms,
short so a restarted node is reached quickly; a link waiting out its back-off
dials at once when the peer's own connection on that channel is accepted,
which says it is up), also when bytes sent on one
stay unacknowledged for `user_timeout_s` (3 s; TCP_USER_TIMEOUT: a partition
that drops packets leaves the connection open, with TCP's retransmissions
backed off by then to tens of seconds); while a link is down its
messages are dropped, which Raft tolerates (appends are re-sent after
`resend_ticks`, heartbeats every interval). A replication link whose socket
buffer exceeds `replication_buffer_max` also drops, bounding memory when a
follower stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from dledger.messages import CHANNEL_CONTROL, CHANNEL_REPLICATION, AppendRequest, Message
from dledger.runtime.codec import (
    HELLO_BYTES_MAX,
    CodecError,
    PeerHello,
    PeerVersionError,
    decode_batch,
    decode_challenge,
    decode_hello,
    decode_proof,
    encode_batches,
    encode_challenge,
    encode_hello,
    encode_proof,
    format_address,
    parse_address,
    peer_claim,
)
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire import busy_poll
from ledgermq.wire.auth import (
    SECRET_BYTES_MIN,
    client_proof,
    new_challenge,
    proof_matches,
    server_proof,
)
from ledgermq.wire.codec import encode_frame
from ledgermq.wire.frame_protocol import FrameProtocol
from ledgermq.wire.streams import read_frame
from ledgermq.wire.tls import client_context, server_context

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# Messages are cut into frames of about this many bytes (before compression).
FRAME_PAYLOAD_BYTES = 4 * 1024 * 1024
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 0.5
CONNECT_TIMEOUT_S = 2.0
# A link's bytes unacknowledged this long abort its connection (TCP_USER_TIMEOUT),
# and the link re-dials. Without it, a connection a partition cut silently
# (packets dropped, no reset) stays open while TCP backs its retransmissions
# off, doubling up to 2 minutes apart: after a one-minute partition a healed
# follower heard nothing for tens of seconds more (a chaos run, 2026-12-07).
# A healthy peer, even one whose process is paused, has its kernel acknowledge.
PEER_USER_TIMEOUT_S = 3.0
# Replication payloads are compressed from this size on: catch-up batches.
# A steady-state Ready (tens to hundreds of KiB) is cheaper to send as is on
# loopback or a LAN: zstd costs ~20-40 us to compress and up to ~70 us to
# decompress per 100 KiB, a loopback send ~20 us of kernel time.
REPLICATION_COMPRESS_THRESHOLD = 1024 * 1024
# Connections still in their handshake, overall (per source address the
# default is 2 * peers + 4: every peer of a one-host group re-dialling both
# channels at once still fits).
DEFAULT_MAX_PENDING = 64
# Refusals logged per second at most; the rest are counted and the next
# logged line says how many were not (a storm must not flood the log).
WARNINGS_PER_SECOND = 10

# Why a handshake was refused (the `reason` label of the auth-failure metric).
REASON_BAD_PROOF = "bad_proof"          # challenged, did not prove the cluster secret
REASON_NO_PROOF = "no_proof"            # HELLO without a nonce to a node with a secret
REASON_NOT_EXPECTED = "auth_not_expected"  # HELLO with a nonce to a node without one
REASON_UNKNOWN_PEER = "unknown_peer"    # claims an id that is no peer, or our own
REASON_VERSION = "version_mismatch"     # another peer protocol version (another release)
REASON_WRONG_NODE = "wrong_node"        # addressed to another node id
REASON_WRONG_GROUP = "wrong_group"
REASON_MALFORMED = "malformed"          # not a valid handshake frame
REASON_TIMEOUT = "timeout"              # handshake deadline passed
REASON_CONNECTION_LIMIT = "connection_limit"  # closed to stay within the caps
REASON_PEER_PROOF = "peer_bad_proof"    # a node we dialled did not prove the secret
REASON_PEER_TLS = "peer_tls"            # a node we dialled failed TLS verification

Deliver = Callable[[list[Message]], None]
AuthFailure = Callable[[str], None]
# Whether to accept a connection from a node that is not a listed peer.
AcceptPeer = Callable[[int], bool]
Address = tuple[str, int]


def tls_contexts(cert_file: str, key_file: str,
                 ca_file: str = "") -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for the Raft port from certificate files.

    The listener presents `cert_file` and, with `ca_file`, requires peers to
    present a certificate that CA signed (mutual TLS). The dialer presents
    the same certificate and verifies the listener against `ca_file` *with*
    hostname checking: the certificate must name the peer's address as
    written in the group's peers (an IP address SAN for peers addressed by
    IP), so one node's certificate cannot stand in for another's address.
    """
    return (server_context(cert_file, key_file, ca_file),
            client_context(ca_file, cert_file, key_file, check_hostname=True))


class PeerRefused(Exception):
    """A handshake that failed; `reason` is one of the REASON_* labels."""

    def __init__(self, reason: str, detail: str, hello: PeerHello | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.hello = hello


class _WarnLimiter:
    """At most `per_second` lines per second; counts what it swallowed."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self.window = 0.0
        self.used = 0
        self.suppressed = 0

    def take(self) -> int | None:
        """None: do not log; else the number of lines suppressed since the last one."""
        now = time.monotonic()
        if now - self.window >= 1.0:
            self.window, self.used = now, 0
        if self.used >= self.per_second:
            self.suppressed += 1
            return None
        self.used += 1
        suppressed, self.suppressed = self.suppressed, 0
        return suppressed


@dataclass(eq=False, slots=True)
class _Handshaking:
    """An inbound connection that has not finished its handshake."""

    host: str
    conn: FrameProtocol
    evicted: bool = False


class _Link:
    """One outgoing connection to a peer for one channel, re-dialled forever."""

    def __init__(self, transport: PeerTransport, peer: int, channel: str,
                 address: tuple[str, int]) -> None:
        self.transport = transport
        self.peer = peer
        self.channel = channel
        self.address = address
        self.writer: asyncio.StreamWriter | None = None
        # writer.transport, set and cleared with `writer`: `send` (a few
        # times per message) writes to it without the StreamWriter's calls.
        self._wire: asyncio.WriteTransport | None = None
        self.task: asyncio.Task[None] | None = None
        # Set when the peer is dropped: the link never dials again.
        self.removed = False
        self.connects = 0
        self.dropped = 0
        self.frames = 0
        self.bytes = 0
        self.compress_threshold = (
            transport.compress_threshold if channel == CHANNEL_REPLICATION else None
        )
        # The last handshake failure logged; logged again only when it changes
        # (a peer with another secret would otherwise log twice a second).
        self._last_failure = ""
        # Set by `wake` (the peer dialled us, so it is up): ends a back-off.
        self._woken = asyncio.Event()

    def send(self, messages: Sequence[Message]) -> None:
        wire = self._wire
        if wire is None or wire.is_closing():
            self.dropped += len(messages)
            return
        limit = self.transport.replication_buffer_max
        if self.channel == CHANNEL_REPLICATION and wire.get_write_buffer_size() > limit:
            self.dropped += len(messages)
            return
        frames = [encode_frame(p, compress_threshold=self.compress_threshold)
                  for p in encode_batches(messages, FRAME_PAYLOAD_BYTES,
                                          self.transport.stamp)]
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        wire.write(data)
        self.frames += len(frames)
        self.bytes += len(data)
        expect = self.transport.expect_acks
        if expect is not None and any(type(m) is AppendRequest and m.entries for m in messages):
            expect()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        """HELLO; with a secret, check the listener's proof, then send ours."""
        t = self.transport
        nonce = new_challenge() if t.secret else None
        writer.write(encode_frame(encode_hello(t.group, t.node_id, self.peer, self.channel,
                                               nonce, t.advertise), compress_threshold=None))
        if nonce is None:
            return
        payload = await read_frame(reader, HELLO_BYTES_MAX)
        if payload is None:
            raise PeerRefused("closed", "the peer closed the connection during the handshake "
                              "(see its log: it may have no cluster secret or not know "
                              "this node)")
        challenge, proof = decode_challenge(payload)
        claim = peer_claim(t.group, t.node_id, self.peer, self.channel)
        if not proof_matches(server_proof(t.secret, challenge, nonce, claim), proof):
            raise PeerRefused(REASON_PEER_PROOF, "the peer did not prove the cluster secret "
                              "(another secret, or not a node of this group)")
        writer.write(encode_frame(encode_proof(client_proof(t.secret, challenge, nonce, claim)),
                                  compress_threshold=None))

    def _handshake_failed(self, reason: str, detail: str) -> None:
        if reason in (REASON_PEER_PROOF, REASON_PEER_TLS):
            self.transport.count_failure(reason)
        text = f"{reason}: {detail}"
        if text != self._last_failure:
            self._last_failure = text
            t = self.transport
            log.warning("raft %s/%d: handshake with node %d at %s:%d (%s) failed: %s", t.group,
                        t.node_id, self.peer, *self.address, self.channel, text)

    async def run(self) -> None:
        t = self.transport
        backoff = BACKOFF_MIN_S
        loop = asyncio.get_running_loop()
        while not t.closing and not self.removed:
            local = (t.bind_host, 0) if t.bind_host else None
            host, port = self.address
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    reader, writer = await asyncio.open_connection(
                        host, port, local_addr=local, ssl=t.client_ssl,
                        server_hostname=host if t.client_ssl is not None else None)
            except ssl.SSLError as exc:
                self._handshake_failed(REASON_PEER_TLS, str(exc))
                backoff = await self._back_off(backoff)
                continue
            except (OSError, TimeoutError):
                backoff = await self._back_off(backoff)
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                int(t.user_timeout_s * 1000))
            try:
                async with asyncio.timeout(t.handshake_timeout):
                    await self._handshake(reader, writer)
            except (PeerRefused, CodecError, LedgerMQError, OSError, TimeoutError,
                    asyncio.IncompleteReadError) as exc:
                reason = exc.reason if isinstance(exc, PeerRefused) else type(exc).__name__
                self._handshake_failed(reason, str(exc) or "no answer")
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                backoff = await self._back_off(backoff)
                continue
            if self._last_failure:
                log.warning("raft %s/%d: handshake with node %d (%s) succeeds again", t.group,
                            t.node_id, self.peer, self.channel)
                self._last_failure = ""
            if self.removed:  # dropped during the handshake
                writer.transport.abort()
                return
            self.writer, self._wire = writer, writer.transport
            self._woken.clear()  # connected: an earlier wake is spent
            self.connects += 1
            started = loop.time()
            try:
                # The peer never writes after the handshake: any read result
                # (EOF, data, reset) means the connection is over.
                await reader.read(1)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                self.writer = self._wire = None
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            if loop.time() - started > 1.0:
                backoff = BACKOFF_MIN_S
            backoff = await self._back_off(backoff)

    async def _back_off(self, backoff: float) -> float:
        """Wait `backoff` seconds before the next dial, or until `wake` (also
        one that came during the dial that just failed: the peer may have
        started listening since); returns the next back-off (doubled, or the
        shortest after a wake)."""
        if not self._woken.is_set():
            try:
                async with asyncio.timeout(backoff):
                    await self._woken.wait()
            except TimeoutError:
                return min(backoff * 2, BACKOFF_MAX_S)
        self._woken.clear()
        return BACKOFF_MIN_S

    def wake(self) -> None:
        """The peer just dialled us, so it is up: a link waiting out a
        back-off dials now. Without it a peer restarted after a few seconds
        down was reached up to `BACKOFF_MAX_S` late: long enough, in the
        failover benchmark, for the next election's pre-votes to it to be
        dropped (a candidate that would have won waited a round)."""
        if self._wire is None:
            self._woken.set()

    def close(self) -> None:
        """The transport closes: end the connection, and a back-off too (the
        caller then cancels `run`'s task; ended either way, it does not dial
        again, `closing` being set)."""
        if self.writer is not None:
            self.writer.close()
        self._woken.set()

    def drop(self) -> None:
        """The peer left: stop dialling, and abort the socket with whatever is
        still buffered for it (a removed node gets nothing more)."""
        self.removed = True
        self._woken.set()
        writer, self.writer, self._wire = self.writer, None, None
        if writer is not None:
            writer.transport.abort()
        if self.task is not None:
            self.task.cancel()


class PeerTransport:
    """Listener plus one control and one replication link per peer.

    `peers` maps node ids to Raft addresses, this node's included (where it
    listens and what it advertises to the nodes it dials, unless `advertise`
    says otherwise); it is the initial peer set, changed at runtime with
    `set_peers`, `add_peer` and `remove_peer`. `accept_peer(node_id)` admits
    inbound connections from nodes that are not listed (None: none are).
    `directory_id` (nonzero) is stamped on every message sent.
    `secret` (the cluster secret, empty = no authentication), `server_ssl`
    and `client_ssl` (TLS on the listener and the links, see `tls_contexts`)
    secure the port; `on_auth_failure(reason)` is told of every refused
    handshake.
    """

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
        user_timeout_s: float = PEER_USER_TIMEOUT_S,
        secret: bytes = b"",
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_address: int = 0,
        on_auth_failure: AuthFailure | None = None,
        accept_peer: AcceptPeer | None = None,
        advertise: Address | None = None,
        directory_id: int = 0,
        busy_poll_s: float = 0.0,
    ) -> None:
        if secret and len(secret) < SECRET_BYTES_MIN:
            raise ValueError(f"a cluster secret is at least {SECRET_BYTES_MIN} bytes")
        if (server_ssl is None) != (client_ssl is None):
            raise ValueError("TLS needs both a server and a client context")
        if node_id not in peers:
            raise ValueError(f"node {node_id} has no address among the peers {sorted(peers)}")
        self.group = group
        self.node_id = node_id
        # Where this node listens (bound by `start`; never changes).
        self.listen: Address = peers[node_id]
        # What it tells the nodes it dials (a HELLO's addr).
        self.advertise = format_address(advertise or self.listen)
        # The listed peers (this node excluded), and the learned ones: nodes
        # `accept_peer` admitted that dialled us from an address not listed.
        self.peers: dict[int, Address] = {}
        self.learned: dict[int, Address] = {}
        self.accept_peer = accept_peer
        # This node's data-directory id: when set, every message leaves under
        # it whatever its own field says (the core's and the snapshot
        # transfer's messages alike), so a node never speaks as another disk.
        self.directory_id = directory_id
        self.stamp = directory_id or None
        self.deliver = deliver
        self.bind_host = bind_host
        self.max_frame_bytes = max_frame_bytes
        self.compress_threshold = compress_threshold
        self.replication_buffer_max = replication_buffer_max
        self.handshake_timeout = handshake_timeout
        self.user_timeout_s = user_timeout_s
        self.secret = secret
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.max_pending = max(1, max_pending)
        self._max_pending_per_address = max_pending_per_address
        self.on_auth_failure = on_auth_failure
        self.closing = False
        self._started = False
        self._server: asyncio.Server | None = None
        self._links: dict[tuple[int, str], _Link] = {}
        self._inbound: set[asyncio.Task[None]] = set()
        self._inbound_conns: set[FrameProtocol] = set()
        # Inbound connections in their handshake, oldest first.
        self._handshaking: dict[FrameProtocol, _Handshaking] = {}
        # The authenticated inbound connection of each (peer, channel).
        self._authenticated: dict[tuple[int, str], FrameProtocol] = {}
        self._warnings = _WarnLimiter(WARNINGS_PER_SECOND)
        self.frames_received = 0
        self.messages_received = 0
        self.rejected_connections = 0
        self.accepted_connections = 0
        self.auth_failures: dict[str, int] = {}
        # Messages for a node with no link (not a peer, or dropped).
        self.unroutable = 0
        self._retired: set[asyncio.Task[None]] = set()
        # > 0: after sending entries, poll the inbound connections this long
        # for the acknowledgements (ledgermq/wire/busy_poll.py); from `start`.
        self.busy_poll_s = busy_poll_s
        self.expect_acks: Callable[[], None] | None = None
        self.set_peers(peers)

    @property
    def max_pending_per_address(self) -> int:
        """Handshaking connections per source address (default: every peer
        of a one-host group re-dialling both channels at once still fits)."""
        return self._max_pending_per_address or 2 * len(self.peers) + 4

    # ---------------------------------------------------------- membership

    def set_peers(self, peers: Mapping[int, Address]) -> None:
        """Make the listed peers exactly `peers` (node id -> (host, port));
        this node's own entry, if present, is ignored. Idempotent: only the
        difference acts. New peers are dialled (once started), a peer whose
        address changed is re-dialled at the new one, and a peer no longer in
        `peers` is dropped as by `remove_peer` (if `accept_peer` still admits
        it, it may dial again and be learned). Learned peers stay while
        `accept_peer` admits them."""
        wanted = {n: (str(a[0]), int(a[1])) for n, a in peers.items() if n != self.node_id}
        for node in [n for n in self.peers if n not in wanted]:
            del self.peers[node]
            self._drop(node)
        for node in [n for n in self.learned if n not in wanted and not self._admits(n)]:
            del self.learned[node]
            self._drop(node)
        for node, address in wanted.items():
            self.learned.pop(node, None)
            self.peers[node] = address
            self._link_to(node, address)

    def add_peer(self, node_id: int, address: Address) -> None:
        """List one peer (or move it to a new address)."""
        self.set_peers({**self.peers, node_id: address})

    def remove_peer(self, node_id: int) -> None:
        """Drop a peer: its links stop re-dialling and are aborted with what
        was buffered for them, messages to it are dropped (`unroutable`), its
        inbound connections are closed; it is refused from now on unless
        `accept_peer` admits it."""
        self.peers.pop(node_id, None)
        self.learned.pop(node_id, None)
        self._drop(node_id)

    def _admits(self, node_id: int) -> bool:
        return self.accept_peer is not None and self.accept_peer(node_id)

    def _link_to(self, node: int, address: Address) -> None:
        """Make `node`'s two links dial `address` (new links if it moved)."""
        for channel in (CHANNEL_CONTROL, CHANNEL_REPLICATION):
            link = self._links.get((node, channel))
            if link is not None and link.address == address:
                continue
            if link is not None:
                self._retire(link)
            link = _Link(self, node, channel, address)
            self._links[(node, channel)] = link
            if self._started and not self.closing:
                self._start_link(link)

    def _start_link(self, link: _Link) -> None:
        link.task = asyncio.get_running_loop().create_task(
            link.run(), name=f"raft-link-{self.node_id}->{link.peer}-{link.channel}")

    def _retire(self, link: _Link) -> None:
        link.drop()
        if link.task is not None and not link.task.done():
            # Awaited by `close`, so no task outlives the transport.
            self._retired.add(link.task)
            link.task.add_done_callback(self._retired.discard)

    def _drop(self, node: int) -> None:
        for channel in (CHANNEL_CONTROL, CHANNEL_REPLICATION):
            link = self._links.pop((node, channel), None)
            if link is not None:
                self._retire(link)
            conn = self._authenticated.pop((node, channel), None)
            if conn is not None:
                conn.abort()

    def _learn(self, node: int, addr: str | None) -> None:
        """An admitted node that is not listed dialled us: dial it back at the
        address it advertised (or its new one)."""
        if addr is None or node in self.peers:
            return
        address = parse_address(addr)
        if self.learned.get(node) != address:
            log.info("raft %s/%d: node %d is not a listed peer but is admitted; answering it "
                     "at %s", self.group, self.node_id, node, addr)
            self.learned[node] = address
            self._link_to(node, address)

    async def start(self) -> tuple[str, int]:
        host, port = self.listen
        tls: dict[str, Any] = {}
        if self.server_ssl is not None:
            tls = {"ssl": self.server_ssl, "ssl_handshake_timeout": self.handshake_timeout}
        # Inbound connections are read by a Protocol, not a StreamReader:
        # after the handshake each frame goes to the node from data_received.
        loop = asyncio.get_running_loop()
        poller = busy_poll.shared(loop) if self.busy_poll_s > 0 else None
        if poller is not None:
            self.expect_acks = partial(poller.expect, self.busy_poll_s)
        self._server = await loop.create_server(
            lambda: FrameProtocol(self._on_connect, pending_max=2 * HELLO_BYTES_MAX,
                                  poller=poller),
            host, port, reuse_address=True, **tls)
        self._started = True
        for link in self._links.values():
            self._start_link(link)
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
            else:
                self.unroutable += 1
            return
        groups: dict[tuple[int, str], list[Message]] = {}
        for msg in messages:
            groups.setdefault((msg.dst, msg.channel), []).append(msg)
        for key, batch in groups.items():
            link = self._links.get(key)
            if link is not None:
                link.send(batch)
            else:
                self.unroutable += len(batch)

    def connected(self, peer: int) -> bool:
        """Both links to `peer` are up (False for a node that is no peer)."""
        links = [self._links.get((peer, ch)) for ch in (CHANNEL_CONTROL, CHANNEL_REPLICATION)]
        return all(link is not None and link.writer is not None for link in links)

    def peer_lost(self, peer: int) -> bool:
        """No connection to or from `peer` is open: both links are down (a
        link reads its socket, so it sees the peer's close at once) and no
        authenticated connection of it is left."""
        for channel in (CHANNEL_CONTROL, CHANNEL_REPLICATION):
            link = self._links.get((peer, channel))
            if link is not None and link.writer is not None:
                return False
            if (peer, channel) in self._authenticated:
                return False
        return True

    def inbound(self, peer: int) -> int:
        """How many authenticated connections from `peer` are open (0..2)."""
        return sum((peer, ch) in self._authenticated
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
        tasks += list(self._retired)
        for conn in list(self._inbound_conns):
            conn.close()
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
        return {"links": links, "peers": sorted(self.peers), "learned": sorted(self.learned),
                "unroutable": self.unroutable,
                "frames_received": self.frames_received,
                "messages_received": self.messages_received,
                "accepted_connections": self.accepted_connections,
                "rejected_connections": self.rejected_connections,
                "handshaking_connections": len(self._handshaking),
                "authenticated": bool(self.secret), "tls": self.server_ssl is not None,
                "auth_failures": dict(self.auth_failures)}

    def count_failure(self, reason: str) -> None:
        self.auth_failures[reason] = self.auth_failures.get(reason, 0) + 1
        if self.on_auth_failure is not None:
            self.on_auth_failure(reason)

    # ------------------------------------------------------------- inbound

    def _on_connect(self, conn: FrameProtocol) -> None:
        if self.closing:
            conn.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._inbound.add(task)
        self._inbound_conns.add(conn)
        task.add_done_callback(self._inbound.discard)

    def _admit(self, host: str, conn: FrameProtocol) -> _Handshaking:
        """Take a handshake slot, closing the oldest handshaking connection of
        the same address (or overall) when the cap is reached."""
        same = [h for h in self._handshaking.values() if h.host == host]
        if len(same) >= self.max_pending_per_address:
            self._evict(same[0], f"more than {self.max_pending_per_address} handshaking "
                                 f"connections from {host}")
        if len(self._handshaking) >= self.max_pending:
            self._evict(next(iter(self._handshaking.values())),
                        f"more than {self.max_pending} handshaking connections")
        slot = _Handshaking(host, conn)
        self._handshaking[conn] = slot
        return slot

    def _evict(self, slot: _Handshaking, why: str) -> None:
        slot.evicted = True
        del self._handshaking[slot.conn]
        slot.conn.abort()
        self._refused(slot.conn.peername(), REASON_CONNECTION_LIMIT, why, None)

    def _refused(self, peername: object, reason: str, detail: str,
                 hello: PeerHello | None) -> None:
        self.rejected_connections += 1
        self.count_failure(reason)
        suppressed = self._warnings.take()
        if suppressed is None:
            return
        claim = (f"claims group {hello['group']!r} node {hello['src']} -> {hello['dst']} "
                 f"({hello['channel']}, {'with' if 'nonce' in hello else 'without'} proof)"
                 if hello is not None else "no valid HELLO")
        more = f" ({suppressed} more refusals not logged)" if suppressed else ""
        log.warning("raft %s/%d: refused peer connection from %s, %s: %s: %s%s", self.group,
                    self.node_id, peername, claim, reason, detail, more)

    async def _handshake(self, conn: FrameProtocol) -> PeerHello:
        """HELLO and, with a secret, the challenge."""
        payload = await conn.next_frame(HELLO_BYTES_MAX)
        if payload is None:
            raise PeerRefused(REASON_MALFORMED, "closed before its HELLO")
        try:
            hello = decode_hello(payload)
        except PeerVersionError as exc:
            raise PeerRefused(REASON_VERSION, str(exc)) from None
        src, dst = hello["src"], hello["dst"]
        if hello["group"] != self.group:
            raise PeerRefused(REASON_WRONG_GROUP, f"this is group {self.group!r}", hello)
        if src == self.node_id or (src not in self.peers and not self._admits(src)):
            raise PeerRefused(REASON_UNKNOWN_PEER, f"node {src} is not a peer of node "
                              f"{self.node_id} (peers {sorted(self.peers)})", hello)
        if dst != self.node_id:
            raise PeerRefused(REASON_WRONG_NODE, f"addressed to node {dst}, this is node "
                              f"{self.node_id}", hello)
        nonce = hello.get("nonce")
        if not self.secret:
            if nonce is not None:
                raise PeerRefused(REASON_NOT_EXPECTED, "the peer authenticates with a cluster "
                                  "secret but this node has none configured", hello)
            return hello
        if nonce is None:
            raise PeerRefused(REASON_NO_PROOF, "no proof of the cluster secret offered (a "
                              "node without cluster_secret_file, or not a node)", hello)
        claim = peer_claim(self.group, src, dst, hello["channel"])
        challenge = new_challenge()
        conn.write(encode_frame(
            encode_challenge(challenge, server_proof(self.secret, challenge, nonce, claim)),
            compress_threshold=None))
        payload = await conn.next_frame(HELLO_BYTES_MAX)
        if payload is None:
            raise PeerRefused(REASON_BAD_PROOF, "closed when challenged (it may hold another "
                              "cluster secret)", hello)
        proof = decode_proof(payload)
        if not proof_matches(client_proof(self.secret, challenge, nonce, claim), proof):
            raise PeerRefused(REASON_BAD_PROOF, "wrong proof of the cluster secret", hello)
        return hello

    async def _serve(self, conn: FrameProtocol) -> None:
        try:
            await self._authenticate_and_serve(conn)
        finally:
            self._inbound_conns.discard(conn)
            conn.close()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.wait_closed()

    async def _authenticate_and_serve(self, conn: FrameProtocol) -> None:
        peername = conn.peername()
        host = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        slot = self._admit(host, conn)
        try:
            async with asyncio.timeout(self.handshake_timeout):
                hello = await self._handshake(conn)
        except PeerRefused as exc:
            if not slot.evicted:
                self._refused(peername, exc.reason, str(exc), exc.hello)
            return
        except TimeoutError:
            if not slot.evicted:
                self._refused(peername, REASON_TIMEOUT, f"no complete handshake within "
                              f"{self.handshake_timeout:g} s", None)
            return
        except (CodecError, LedgerMQError, OSError) as exc:
            if not slot.evicted:
                self._refused(peername, REASON_MALFORMED, str(exc) or type(exc).__name__,
                              None)
            return
        finally:
            self._handshaking.pop(conn, None)
        if slot.evicted or conn.closing:
            return
        src = hello["src"]
        if src not in self.peers and not self._admits(src):
            # Dropped while it was authenticating.
            self._refused(peername, REASON_UNKNOWN_PEER, f"node {src} was removed", hello)
            return
        self._learn(src, hello.get("addr"))
        key = (src, hello["channel"])
        previous = self._authenticated.get(key)
        if previous is not None:
            # A peer re-dialled (e.g. after a restart): its old connection is dead.
            previous.close()
        self._authenticated[key] = conn
        self.accepted_connections += 1
        link = self._links.get(key)
        if link is not None:
            link.wake()
        try:
            conn.serve(self._batch_reader(conn, key), self.max_frame_bytes)
            error = await conn.wait_closed()
        finally:
            if self._authenticated.get(key) is conn:
                del self._authenticated[key]
        if isinstance(error, (CodecError, LedgerMQError)):
            self.rejected_connections += 1
            log.warning("raft %s/%d: closing connection from node %d: %s", self.group,
                        self.node_id, src, error)
        elif error is not None:
            log.error("raft %s/%d: closing connection from node %d: %s: %s", self.group,
                      self.node_id, src, type(error).__name__, error, exc_info=error)

    def _batch_reader(self, conn: FrameProtocol, key: tuple[int, str]
                      ) -> Callable[[bytes], None]:
        """What an authenticated connection does with each frame, called
        where its bytes arrive: decode the batch, check it comes from the
        peer the handshake proved and is addressed here, deliver it."""
        src, node_id = key[0], self.node_id

        def on_frame(payload: bytes) -> None:
            if self.closing or self._authenticated.get(key) is not conn:
                conn.close()  # replaced by a re-dial, or the peer was removed
                return
            messages = decode_batch(payload, self.max_frame_bytes)
            for msg in messages:
                if msg.src != src or msg.dst != node_id:
                    raise CodecError(f"message {msg.src}->{msg.dst} on link {src}->{node_id}")
            self.frames_received += 1
            self.messages_received += len(messages)
            self.deliver(messages)

        return on_frame
