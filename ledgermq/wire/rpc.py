"""The RPC server: LedgerMQ frames in, handlers called, answers out (the
client is `rpc_client.py`).

`RpcServer` accepts connections, runs the HELLO handshake, then reads requests
and dispatches each by code to its handler, which gives back an awaitable: a
coroutine (an `async def` handler) runs in a task of its own, so a slow
request does not hold up the others on the connection; a future (a handler
that did its work at once and waits only for, say, a proposal) is answered
from its done callback, with no task at all. Responses carry the request id
and go out in whatever order handlers finish. Protocol violations
(malformed or truncated frames, oversized frames, a failed handshake) get one
error frame and close that connection only. Unknown codes and handler errors
get an error response and the connection goes on.

Authentication (docs/protocol.md "Authentication", docs/security.md): a
server given a `KeyStore` puts a fresh challenge in its HELLO answer; the
client proves an access key with AUTH and checks the server's proof in return
(mutual). With `require_auth`, every request but PING and AUTH before a
successful AUTH is refused with UNAUTHENTICATED and the connection closed;
without it, a connection that does not authenticate stays ANONYMOUS. TLS is
the standard `ssl` module's, under the same frames.

Each connection's bytes are parsed where they arrive
(`server_connection.ServerConnection`): a request's handler is called in the
pass that read it, with no read task per connection step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ConnectionClosedError,
    FrameTooLargeError,
    HandshakeRequiredError,
    InvalidRequestError,
    LedgerMQError,
    MalformedFrameError,
    NoPermissionError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnauthenticatedError,
    UnknownRequestError,
    UnsupportedVersionError,
)
from ledgermq.wire import busy_poll
from ledgermq.wire.auth import (
    ACCESS_KEY_MAX,
    ANONYMOUS,
    CHALLENGE_BYTES,
    KeyStore,
    Principal,
    client_proof,
    new_challenge,
    proof_matches,
    server_proof,
)
from ledgermq.wire.codec import (
    CONNECTION_ERROR_ID,
    DEFAULT_COMPRESS_THRESHOLD,
    DEFAULT_MAX_FRAME_BYTES,
    SUPPORTED_VERSIONS,
    HelloReply,
    Request,
    Response,
    decode_request,
    encode_response,
    encode_result,
    error_response,
)
from ledgermq.wire.limits import (
    SMALL_FRAME_BYTES,
    ByteBudget,
    ConnectionCaps,
    RateLimitedLog,
    ServerLimits,
    map_large_allocations,
    release_free_memory,
)
from ledgermq.wire.server_connection import ServerConnection
from ledgermq.wire.streams import (
    FrameGuard,
    FrameWatch,
    FrameWriter,
    HeldFrame,
    flush_all,
    frame_deadline_error,
    guarded_reads,
    read_frame,
)

log = logging.getLogger(__name__)

# Connections closed for a protocol error or a cap that may linger at once.
MAX_LINGERING = 256
# Free heap goes back to the system (malloc_trim) at most this often: a trim
# walks glibc's free lists (~90 µs on a warm broker), and under a load of
# large requests the frame budget drains after every one of them. A drain
# inside the interval is trimmed when the interval ends.
TRIM_INTERVAL_S = 1.0

ROLES: frozenset[str] = frozenset({"client", "broker", "peer", "admin"})


@dataclass(eq=False)
class Connection:
    """What a handler knows about the connection its request came on."""

    peer: str
    role: str = ""
    version: int = 0
    name: str | None = None
    # Who proved themselves on this connection (the AUTH handshake); None
    # while unauthenticated, ANONYMOUS on a server that runs open.
    principal: Principal | None = None
    # The challenge this server sent in its HELLO answer, until an AUTH
    # consumes it (one attempt per connection).
    challenge: bytes | None = field(default=None, repr=False)
    writer: FrameWriter | None = field(default=None, repr=False)
    # Requests still being answered: their tasks, or the futures or Replies
    # a handler gave back (see RpcServer._start).
    inflight: set[InFlight] = field(default_factory=set, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    reading: bool = field(default=False, repr=False)
    # Set once the connection was refused for authentication: it is closing.
    refused: bool = field(default=False, repr=False)
    # The read loop's progress, which the deadline watchdog reads, and the
    # error the watchdog cancelled the read loop with.
    watch: FrameWatch = field(default_factory=FrameWatch, repr=False)
    expired: LedgerMQError | None = field(default=None, repr=False)
    watchdog: asyncio.TimerHandle | None = field(default=None, repr=False)
    # The connection's bytes (frames are parsed where they arrive).
    protocol: ServerConnection | None = field(default=None, repr=False)

    def stop_reading(self) -> None:
        """No frame is handed over after this; the read loop's task ends and
        its cleanup answers what was read, then closes."""
        if self.protocol is not None:
            self.protocol.halt()
        if self.task is not None:
            self.task.cancel()


class Reply:
    """An answer a plain handler gives later, without a future or a task.

    The handler returns a Reply at once (its checks done) and calls
    `resolve(body)` or `fail(error)` once the answer is known; the server
    answers the request right then, in that same call: the per-message path
    (a send answered from its proposal's completion) takes no loop hop
    between the commit and the answer. Only the first outcome counts; one
    given after the connection closed is dropped."""

    __slots__ = ("_deliver", "_outcome", "_waiter")

    def __init__(self) -> None:
        self._deliver: Callable[[Any, BaseException | None, bool], None] | None = None
        self._outcome: tuple[Any, BaseException | None, bool] | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def resolve(self, body: Any) -> None:
        self._settle(body, None, False)

    def fail(self, error: BaseException) -> None:
        self._settle(None, error, False)

    def cancel(self) -> None:
        """Nobody is left to answer (the connection closed)."""
        self._settle(None, None, True)

    def _settle(self, body: Any, error: BaseException | None, cancelled: bool) -> None:
        if self._outcome is not None:
            return
        self._outcome = (body, error, cancelled)
        # The server's callback holds this Reply (it answers and releases
        # it): dropped once used, so that a request's objects are freed by
        # reference counting as soon as it is answered instead of waiting,
        # as a cycle, for the cyclic collector (whose full collections then
        # grew to tens of milliseconds under load: the p99).
        deliver, self._deliver = self._deliver, None
        if deliver is not None:
            deliver(body, error, cancelled)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _bind(self, deliver: Callable[[Any, BaseException | None, bool], None]) -> None:
        """Where the outcome goes (the server, once the handler returned)."""
        if self._outcome is not None:
            deliver(*self._outcome)
        else:
            self._deliver = deliver

    def _wait(self) -> asyncio.Future[None]:
        """A future done once the outcome is in (a closing connection waits)."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self._outcome is not None:
                self._waiter.set_result(None)
        return self._waiter


# A request in flight on a connection: the task of an `async def` handler,
# a future a handler gave back, or a Reply.
InFlight = asyncio.Future[Any] | Reply

# `handler(body, connection)` gives the response body through an awaitable
# (an `async def` handler's coroutine, or a future) or a Reply (see
# RpcServer._start).
Handler = Callable[[Any, Connection], Awaitable[Any] | Reply]


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class RequestObserver(Protocol):
    """Told of every request a handler ran (the servers' request metrics)."""

    def handled(self, code: int, seconds: float, error: Exception | None,
                result: Any) -> None:
        """`code`'s handler ran for `seconds` and raised `error` (None if it
        answered, or was cancelled) or returned `result` (None if not)."""


class RpcServer:
    """Generic request/response server: `handlers` maps a request code to
    `async def handler(body, connection) -> response body`, or to a plain
    function that checks the request at once and returns a future of the
    body (the per-message path: no task per request).

    A handler reports failure by raising a LedgerMQError (sent with its code);
    any other exception is logged and answered as INTERNAL. `observer`, when
    set, is told of every request a handler ran (requests with an unknown code
    are not).

    `limits` bounds what connections may cost (ledgermq/wire/limits.py):
    frame memory, read deadlines, the idle timeout and connection caps; its
    `max_frame_bytes` wins over the `max_frame_bytes` argument. `limit_events`
    counts what the limits refused or closed, by reason.

    `key_store`: offer the AUTH handshake (a challenge in the HELLO answer)
    and authenticate access keys against it. `require_auth`: refuse every
    request but PING and AUTH until the connection authenticated (needs a
    key store). `ssl`: serve TLS. `auth_failures` counts refused
    authentications by reason (the servers' metrics read it).
    `busy_poll_s` > 0: after writing answers, keep the loop polling the
    connections for that long (ledgermq/wire/busy_poll.py).
    """

    def __init__(
        self,
        name: str,
        handlers: Mapping[int, Handler],
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
        max_inflight_per_connection: int = 1024,
        accepted_roles: frozenset[str] = ROLES,
        handshake_timeout: float = 10.0,
        limits: ServerLimits | None = None,
        key_store: KeyStore | None = None,
        require_auth: bool = False,
        ssl: ssl_module.SSLContext | None = None,
        busy_poll_s: float = 0.0,
    ) -> None:
        if RequestCode.HELLO in handlers or RequestCode.AUTH in handlers:
            raise ValueError("HELLO and AUTH are handled by the RPC layer")
        if require_auth and key_store is None:
            raise ValueError("require_auth needs a key store")
        self.name = name
        self.handlers: dict[int, Handler] = dict(handlers)
        self.handlers.setdefault(RequestCode.PING, _ping)
        self.limits = limits if limits is not None else ServerLimits(
            max_frame_bytes=max_frame_bytes,
            frame_memory_budget_bytes=max(
                ServerLimits.frame_memory_budget_bytes, 2 * max_frame_bytes))
        self.max_frame_bytes = self.limits.max_frame_bytes
        self.budget = ByteBudget(self.limits.frame_memory_budget_bytes,
                                 self.limits.small_reserve)
        self.caps = ConnectionCaps(self.limits.max_connections,
                                   self.limits.max_connections_per_address)
        # reason -> count: refused connections, closed idle or slow ones.
        self.limit_events: dict[str, int] = {}
        self._limit_log = RateLimitedLog()
        self._large_since_trim = False
        self._trimmed_at = float("-inf")  # loop time of the last trim
        self._trim_timer: asyncio.TimerHandle | None = None
        self.trims = 0  # heap trims done (release_free_memory)
        self._lingering = 0
        self.compress_threshold = compress_threshold
        self.max_inflight = max_inflight_per_connection
        self.accepted_roles = accepted_roles
        self.handshake_timeout = handshake_timeout
        self.observer: RequestObserver | None = None
        self.key_store = key_store
        self.require_auth = require_auth
        self.ssl = ssl
        self.auth_failures: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._closing = False
        read_timeout = self.limits.frame_read_timeout
        self._guard = FrameGuard(self.max_frame_bytes, self.budget, read_timeout)
        self._hello_guard = FrameGuard(self.limits.max_handshake_frame_bytes, self.budget,
                                       read_timeout)
        # Tasks of connections refused at once (they only say why and close).
        self._detached: set[asyncio.Task[None]] = set()
        # The connections' writers with answers queued (`flush_answers`).
        self._unflushed: dict[FrameWriter, None] = {}
        self.busy_poll_s = busy_poll_s
        self._poller: busy_poll.BusyPoll | None = None  # the loop's, from `start` (busy_poll_s > 0)
        self._expect_next: Callable[[], None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after start()."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def poller(self) -> busy_poll.BusyPoll | None:
        """The event loop's busy poll this server feeds (busy_poll_s > 0), once started."""
        return self._poller

    def flush_answers(self) -> None:
        """Write the answers queued so far in this loop pass now, instead of
        at the pass's end: a caller with more work in the pass (the broker's
        ConsumeQueue writes after a commit) lets its clients go on first."""
        flush_all(self._unflushed)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and start accepting; port 0 picks a free port. Returns the bound address."""
        # Frame buffers must give their memory back when freed (limits.py).
        map_large_allocations()
        if self.busy_poll_s > 0:
            self._poller = busy_poll.shared()
            self._expect_next = partial(self._poller.expect, self.busy_poll_s)
        poller = self._poller
        self._server = await asyncio.get_running_loop().create_server(
            lambda: ServerConnection(self._on_connect, poller=poller), host, port, ssl=self.ssl,
            ssl_handshake_timeout=self.handshake_timeout if self.ssl is not None else None)
        return self.address

    async def close(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to `grace` seconds),
        deliver their responses, then close every connection."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        tasks = [c.task for c in list(self._connections) if c.task is not None]
        for conn in list(self._connections):
            if conn.reading:
                # Stops only the reading; the connection's cleanup still waits
                # for its in-flight handlers.
                conn.stop_reading()
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 1.0)
        if self._server is not None:
            await self._server.wait_closed()

    # ----------------------------------------------------------- connection

    def _on_connect(self, proto: ServerConnection) -> None:
        """A connection was accepted (its protocol just made): admit it and
        start the task that reads its handshake and then watches it."""
        assert proto.transport is not None
        loop = asyncio.get_running_loop()
        peername = proto.transport.get_extra_info("peername")
        conn = Connection(peer=_fmt_addr(peername), protocol=proto)
        conn.writer = FrameWriter(asyncio.StreamWriter(proto.transport, proto, None, loop),
                                  compress_threshold=self.compress_threshold,
                                  unflushed=self._unflushed, on_write=self._expect_next)
        if self._closing:
            self._spawn_detached(conn.writer.close())
            return
        address = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        refused = self.caps.admit(address)
        if refused is not None:
            self._spawn_detached(self._refuse_connection(conn, proto, address, refused))
            return
        conn.task = loop.create_task(self._serve(conn, proto))
        conn.task.add_done_callback(lambda _: self.caps.release(address))
        self._connections.add(conn)

    def _spawn_detached(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    async def _refuse_connection(self, conn: Connection, reader: ServerConnection,
                                 address: str, reason: str) -> None:
        """Over a connection cap: one error frame (id 0), then close."""
        assert conn.writer is not None
        lingering = self._linger(conn, reader)
        if reason == "total":
            message = (f"{self.name} has {self.caps.open} connections, its limit"
                       f" (max_connections {self.caps.total}); retry later")
        else:
            message = (f"too many connections from {address}: {self.caps.count(address)},"
                       f" limit max_connections_per_address {self.caps.per_address}")
        self._count(f"connections_{reason}")
        skipped = self._limit_log.should_log(f"connections_{reason}")
        if skipped is not None:
            log.warning("%s: refused connection from %s: %s%s", self.name, conn.peer, message,
                        f" ({skipped} more refused since the last line)" if skipped else "")
        conn.writer.send(encode_response(error_response(
            CONNECTION_ERROR_ID, ServiceUnavailableError(message))))
        try:
            await conn.writer.close(flush_timeout=1.0)
        finally:
            self._lingering -= lingering

    def _linger(self, conn: Connection, reader: ServerConnection) -> bool:
        """Let the connection's close linger so its error frame arrives
        (FrameWriter.close), unless MAX_LINGERING already do: a flood of
        refused connections must not hold sockets open."""
        if self._lingering >= MAX_LINGERING or conn.writer is None:
            return False
        conn.writer.linger_reader = reader
        self._lingering += 1
        return True

    def _count(self, reason: str) -> None:
        self.limit_events[reason] = self.limit_events.get(reason, 0) + 1

    async def _serve(self, conn: Connection, reader: ServerConnection) -> None:
        fatal: LedgerMQError | None = None
        fatal_id = CONNECTION_ERROR_ID
        conn.reading = True
        try:
            try:
                # Before the handshake a frame may only be small: a stranger
                # must not make the server buffer megabytes.
                async with asyncio.timeout(self.handshake_timeout):
                    with guarded_reads(self._hello_guard):
                        await self._handshake(reader, conn)
            except TimeoutError:
                raise HandshakeRequiredError(
                    f"no HELLO within {self.handshake_timeout:g}s"
                ) from None
            # Deadlines (idle, frame read) are the watchdog's: no timer per
            # frame. Until a connection has authenticated on a server that
            # requires it, its frames stay as small as the handshake's: a
            # stranger's PING bomb costs the server no more than a HELLO
            # (`_authenticate` raises the cap).
            conn.watch.since = asyncio.get_running_loop().time()
            self._watch_deadlines(conn)
            unproven = self.require_auth and conn.principal is None
            # Every whole frame goes to its handler as it arrives; reading
            # stops while max_inflight requests run or answers pile up unread.
            await reader.serve(partial(self._on_frame, conn),
                               self._hello_guard if unproven else self._guard,
                               conn.watch, self.max_inflight)
        except _HandshakeFailed as exc:
            fatal, fatal_id = exc.error, exc.request_id
        except (MalformedFrameError, FrameTooLargeError, HandshakeRequiredError,
                RequestTimeoutError, ServiceUnavailableError) as exc:
            self._count(_LIMIT_REASONS.get(type(exc), "protocol_error"))
            fatal = exc
            # The failed frame may have been a large partial one, now freed.
            self._large_since_trim = True
            self._linger(conn, reader)
        except (ConnectionError, OSError):
            pass  # peer vanished; nothing to tell it
        except asyncio.CancelledError:
            # The watchdog's deadline, or the server closing: either way the
            # cleanup below is the graceful part.
            if conn.expired is not None:
                fatal = conn.expired
                self._count(_LIMIT_REASONS.get(type(fatal), "protocol_error"))
                self._large_since_trim = True
                self._linger(conn, reader)
        finally:
            # From here on close() must not cancel us: the cleanup is the graceful part.
            conn.reading = False
            reader.halt()
            if conn.watchdog is not None:
                conn.watchdog.cancel()
            try:
                await self._finish(conn, fatal, fatal_id)
            finally:
                if conn.writer is not None and conn.writer.linger_reader is not None:
                    self._lingering -= 1
                self._trim_if_drained()

    def _watch_deadlines(self, conn: Connection) -> None:
        """Start the connection's deadline watchdog, if it has a deadline.

        Each frame must arrive whole within the frame read timeout of its
        first byte, and a connection with nothing in flight is closed after
        the idle timeout without a request: a long-poll PULL waiting for
        messages is activity, silence is not. One timer per connection, set
        to the earliest moment either could pass, checks the read loop's
        `watch` and cancels the loop (with `conn.expired` set) when one did.
        """
        idle, read_timeout = self.limits.idle_timeout, self.limits.frame_read_timeout
        if idle is None and read_timeout is None:
            return
        loop = asyncio.get_running_loop()

        def check() -> None:
            if not conn.reading or conn.task is None:
                return
            watch, now = conn.watch, loop.time()
            limit = read_timeout if watch.reading else idle
            expired: LedgerMQError | None = None
            if limit is None:
                deadline = now + (idle or read_timeout or 1.0)
            elif not watch.reading and conn.inflight:
                # Waiting for a request while others run is not silence.
                watch.since = now
                deadline = now + limit
            elif now - watch.since >= limit:
                expired = (frame_deadline_error(watch, limit) if watch.reading else
                           _IdleTimeout(f"no request for {limit:g}s: closing the idle connection"))
            else:
                deadline = watch.since + limit
            if expired is not None:
                conn.expired = expired
                conn.stop_reading()
                return
            conn.watchdog = loop.call_at(deadline, check)

        first = min(t for t in (idle, read_timeout) if t is not None)
        conn.watchdog = loop.call_at(loop.time() + first, check)

    def _on_frame(self, conn: Connection, frame: HeldFrame) -> None:
        """One request frame, in the pass that read it."""
        try:
            request = decode_request(frame.payload)
        except BaseException:
            self._release(frame)
            raise
        # The request holds the decoded body now; the frame only keeps its
        # reservation until the answer is sent.
        frame.payload = b""
        self._start(conn, request, frame)

    def _release(self, frame: HeldFrame) -> None:
        """A request was answered (or never ran): its frame's bytes go back to
        the budget; once the budget drains after large frames, the freed heap
        goes back to the system so RSS returns to its baseline after a flood."""
        if frame.held > SMALL_FRAME_BYTES:
            self._large_since_trim = True
        frame.release()
        if self._large_since_trim:
            self._trim_if_drained()

    def _trim_if_drained(self) -> None:
        if not self._large_since_trim or self.budget.used != 0:
            return
        loop = asyncio.get_running_loop()
        due = self._trimmed_at + TRIM_INTERVAL_S
        if loop.time() >= due:
            self._large_since_trim = False
            self._trimmed_at = loop.time()
            self.trims += 1
            release_free_memory()
        elif self._trim_timer is None and not self._closing:
            self._trim_timer = loop.call_at(due, self._trim_due)

    def _trim_due(self) -> None:
        self._trim_timer = None
        self._trim_if_drained()

    async def _finish(self, conn: Connection, fatal: LedgerMQError | None, fatal_id: int) -> None:
        assert conn.writer is not None
        try:
            # Requests read before the error or shutdown still get their answers.
            if conn.inflight:
                await asyncio.wait([r._wait() if isinstance(r, Reply) else r
                                    for r in conn.inflight], timeout=5.0)
            for t in list(conn.inflight):
                t.cancel()
            if fatal is not None:
                log.info("%s: closing %s: %s", self.name, conn.peer, fatal)
                conn.writer.send(encode_response(error_response(fatal_id, fatal)))
            await conn.writer.close()
        finally:
            self._connections.discard(conn)

    async def _handshake(self, reader: ServerConnection, conn: Connection) -> None:
        payload = await read_frame(reader, self.max_frame_bytes)
        if payload is None:
            raise ConnectionClosedError("closed before HELLO")
        request = decode_request(payload)
        if request.code != RequestCode.HELLO:
            raise _HandshakeFailed(
                request.id,
                HandshakeRequiredError(
                    f"the first request on a connection must be HELLO ({int(RequestCode.HELLO)}),"
                    f" got code {request.code}"
                ),
            )
        body = request.body
        if not isinstance(body, dict):
            raise _HandshakeFailed(
                request.id, InvalidRequestError("HELLO body must be a map {version, role}")
            )
        version, role = body.get("version"), body.get("role")
        if (
            not isinstance(version, int)
            or isinstance(version, bool)
            or version not in SUPPORTED_VERSIONS
        ):
            raise _HandshakeFailed(
                request.id,
                UnsupportedVersionError(
                    f"protocol version {version!r} is not supported by {self.name};"
                    f" supported: {sorted(SUPPORTED_VERSIONS)}",
                    data={"supported": sorted(SUPPORTED_VERSIONS)},
                ),
            )
        if not isinstance(role, str) or role not in self.accepted_roles:
            raise _HandshakeFailed(
                request.id,
                NoPermissionError(
                    f"role {role!r} is not accepted by {self.name};"
                    f" accepted: {sorted(self.accepted_roles)}"
                ),
            )
        name = body.get("name")
        conn.version, conn.role = version, role
        conn.name = name if isinstance(name, str) else None
        reply = HelloReply(version=version, server=self.name, max_frame_bytes=self.max_frame_bytes)
        if self.key_store is None:
            conn.principal = ANONYMOUS
        else:
            # Only a server that authenticates adds the key: an open server's
            # HELLO answer is byte for byte what it was before AUTH existed.
            conn.challenge = new_challenge()
            reply["auth"] = {"challenge": conn.challenge}
            conn.principal = None if self.require_auth else ANONYMOUS
        assert conn.writer is not None
        conn.writer.send(encode_response(Response(request.id, body=reply)))

    def _authenticate(self, body: Any, conn: Connection) -> dict[str, bytes]:
        """Check an AUTH request and set `conn.principal`; the server's proof.
        Synchronous on purpose: it completes before the next request read on
        the connection is dispatched, so a pipelined request sees the result."""
        assert self.key_store is not None
        challenge, conn.challenge = conn.challenge, None
        if challenge is None:
            raise _AuthRefused("repeated", "", "AUTH may be sent once per connection")
        if not isinstance(body, dict):
            raise _AuthRefused("malformed", "", "AUTH body must be {access_key, nonce, proof}")
        key, nonce, proof = body.get("access_key"), body.get("nonce"), body.get("proof")
        if (not isinstance(key, str) or not 0 < len(key) <= ACCESS_KEY_MAX
                or not isinstance(nonce, bytes) or len(nonce) != CHALLENGE_BYTES):
            raise _AuthRefused("malformed", key if isinstance(key, str) else "",
                               "AUTH body must be {access_key: str, nonce: 16 bytes, proof: bytes}")
        found = self.key_store.lookup(key)
        if found is None:
            raise _AuthRefused("unknown_key", key, "unknown access key or wrong secret")
        secret, principal = found
        claim = f"{conn.role}:{conn.name or ''}"
        if not proof_matches(client_proof(secret, challenge, nonce, claim), proof):
            # Same message as an unknown key: the answer must not tell an
            # attacker which access keys exist.
            raise _AuthRefused("bad_proof", key, "unknown access key or wrong secret")
        conn.principal = principal
        if conn.protocol is not None:
            conn.protocol.set_guard(self._guard)  # the full frame cap from the next frame
        return {"proof": server_proof(secret, challenge, nonce, claim)}

    def _refuse(self, conn: Connection, reason: str, access_key: str, message: str) -> None:
        """Count and log one refused authentication, then close the connection
        (the caller has queued the UNAUTHENTICATED answer)."""
        if not conn.refused:
            conn.refused = True
            self.auth_failures[reason] += 1
            # One line per refusal: who and which key, never a proof or secret.
            log.warning("%s: authentication refused for %s (role %r, access key %r): %s: %s",
                        self.name, conn.peer, conn.role, access_key[:ACCESS_KEY_MAX], reason,
                        message)
        if conn.reading:
            # Stops reading; the connection's cleanup still answers what was read.
            conn.stop_reading()

    def _gate(self, conn: Connection, request: Request) -> Response | None:
        """The answer to an AUTH request, or to a request the connection may
        not make yet; None for a request that goes to its handler."""
        code = request.code
        if code == RequestCode.AUTH and self.key_store is not None:
            try:
                return Response(request.id, body=self._authenticate(request.body, conn))
            except _AuthRefused as exc:
                self._refuse(conn, exc.reason, exc.access_key, str(exc))
                return error_response(request.id, UnauthenticatedError(str(exc)))
        if conn.refused or (conn.principal is None and code != RequestCode.PING):
            message = (f"{self.name} requires authentication: send AUTH after HELLO"
                       f" before request code {code}")
            self._refuse(conn, "no_auth", "", message)
            return error_response(request.id, UnauthenticatedError(message))
        return None

    def _start(self, conn: Connection, request: Request, frame: HeldFrame) -> None:
        """Call the request's handler here in the read loop (AUTH, answered
        by `_gate`, sets the principal before the next frame is read). A
        plain handler's checks raise at once; its Reply is answered when the
        handler settles it, its future from a done callback; an `async def`
        handler's coroutine runs in a task of its own."""
        release = partial(_finished, self, conn, frame)
        gated = self._gate(conn, request)
        rid, code = request.id, request.code
        if gated is not None:
            self._send(conn, rid, encode_response(gated))
            release(None)
            return
        handler = self.handlers.get(code)
        started = time.perf_counter()
        try:
            if handler is None:
                raise UnknownRequestError(f"{self.name} has no request code {code}")
            pending = handler(request.body, conn)
            if isinstance(pending, Reply):
                conn.inflight.add(pending)
                pending._bind(partial(self._reply_done, conn, rid, code, handler, started,
                                      release, pending))
                return
            if not isinstance(pending, asyncio.Future):
                pending = asyncio.ensure_future(
                    self._answer_when_done(conn, rid, code, handler, started, pending))
        except Exception as exc:
            self._answer(conn, rid, code, handler, started, None, exc)
            release(None)
            return
        conn.inflight.add(pending)
        if isinstance(pending, asyncio.Task):
            pending.add_done_callback(release)
        else:
            pending.add_done_callback(
                partial(self._future_done, conn, rid, code, handler, started, release))

    def _reply_done(self, conn: Connection, rid: int, code: int, handler: Handler,
                    started: float, release: Callable[[InFlight | None], None], reply: Reply,
                    body: Any, error: BaseException | None, cancelled: bool) -> None:
        try:
            if cancelled or (error is not None and not isinstance(error, Exception)):
                # The connection closed (nobody to answer), or the request was
                # cancelled: never raised here, in the caller's completion.
                self._observe(handler, code, started, None, None)
            else:
                self._answer(conn, rid, code, handler, started, body,
                             error if isinstance(error, Exception) else None)
        finally:
            release(reply)

    async def _answer_when_done(self, conn: Connection, rid: int, code: int, handler: Handler,
                                started: float, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            self._observe(handler, code, started, None, None)
            raise
        except Exception as exc:
            self._answer(conn, rid, code, handler, started, None, exc)
        else:
            self._answer(conn, rid, code, handler, started, result, None)
        assert conn.writer is not None
        with contextlib.suppress(ConnectionError):
            await conn.writer.drain()

    def _future_done(self, conn: Connection, rid: int, code: int, handler: Handler,
                     started: float, release: Callable[[asyncio.Future[Any]], None],
                     pending: asyncio.Future[Any]) -> None:
        try:
            if pending.cancelled():  # the connection closed: nobody to answer
                self._observe(handler, code, started, None, None)
            else:
                error = pending.exception()
                if error is not None and not isinstance(error, Exception):
                    raise error
                self._answer(conn, rid, code, handler, started,
                             None if error is not None else pending.result(), error)
        finally:
            release(pending)

    def _answer(self, conn: Connection, rid: int, code: int, handler: Handler | None,
                started: float, result: Any, error: Exception | None) -> None:
        """Send the answer to request `rid`: `result`, or `error` (a
        LedgerMQError goes with its code; anything else is our bug, logged
        and answered INTERNAL)."""
        if error is not None and not isinstance(error, LedgerMQError):
            log.error("%s: handler for code %d failed", self.name, code, exc_info=error)
        self._observe(handler, code, started, error, result)
        try:
            payload = (encode_result(rid, result) if error is None
                       else encode_response(error_response(rid, error)))
        except TypeError as exc:
            # The handler returned something msgpack cannot carry: that is our bug,
            # reported as INTERNAL rather than killing the connection.
            log.error("%s: unencodable response to code %d: %s", self.name, code, exc)
            payload = encode_response(error_response(rid, exc))
        self._send(conn, rid, payload)

    def _send(self, conn: Connection, rid: int, payload: bytes) -> None:
        if len(payload) > self.max_frame_bytes:
            payload = encode_response(
                error_response(
                    rid,
                    FrameTooLargeError(
                        f"response of {len(payload)} bytes exceeds the frame limit"
                        f" of {self.max_frame_bytes}"
                    ),
                )
            )
        assert conn.writer is not None
        conn.writer.send(payload)

    def _observe(self, handler: Handler | None, code: int, started: float,
                 error: Exception | None, result: Any) -> None:
        if handler is not None and self.observer is not None:
            self.observer.handled(code, time.perf_counter() - started, error, result)


def _finished(server: RpcServer, conn: Connection, frame: HeldFrame,
              pending: InFlight | None) -> None:
    """A request was answered (or its task ended): forget it, free its
    frame's budget and let the connection read one more."""
    if pending is not None:
        conn.inflight.discard(pending)
    server._release(frame)
    if conn.protocol is not None:
        conn.protocol.request_done()


class _IdleTimeout(RequestTimeoutError):
    """Closed for silence after the handshake (TIMEOUT on the wire)."""


# What each connection-closing error counts as in RpcServer.limit_events.
_LIMIT_REASONS: dict[type, str] = {
    FrameTooLargeError: "frame_too_large",
    RequestTimeoutError: "frame_read_timeout",
    _IdleTimeout: "idle_timeout",
    ServiceUnavailableError: "frame_budget",
    MalformedFrameError: "malformed_frame",
    HandshakeRequiredError: "handshake",
}


class _AuthRefused(Exception):
    def __init__(self, reason: str, access_key: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.access_key = access_key


class _HandshakeFailed(Exception):
    def __init__(self, request_id: int, error: LedgerMQError) -> None:
        super().__init__(str(error))
        self.request_id = request_id
        self.error = error


async def _ping(body: Any, conn: Connection) -> Any:
    return body
