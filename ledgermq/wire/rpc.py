"""A small asyncio RPC layer over LedgerMQ frames: one server helper, one client.

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

`RpcClient` is one connection: `request()` sends and waits for the response with
the same id, returning its body or raising the typed LedgerMQError. Reconnecting
is left to the caller (a producer fails over to another broker, a broker to
another NameServer), which knows better than this layer what to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl as ssl_module
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
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
    error_from_response,
)
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.wire.auth import (
    ACCESS_KEY_MAX,
    ANONYMOUS,
    CHALLENGE_BYTES,
    Credentials,
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
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    HelloReply,
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_response,
    hello_body,
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
from ledgermq.wire.streams import (
    FrameGuard,
    FrameWatch,
    FrameWriter,
    HeldFrame,
    frame_deadline_error,
    guarded_reads,
    read_frame,
    read_held_frame,
)

log = logging.getLogger(__name__)

# Connections closed for a protocol error or a cap that may linger at once.
MAX_LINGERING = 256

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
    # Requests still being answered: their tasks, or the futures a handler
    # gave back (see RpcServer._start).
    inflight: set[asyncio.Future[Any]] = field(default_factory=set, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    reading: bool = field(default=False, repr=False)
    # Set once the connection was refused for authentication: it is closing.
    refused: bool = field(default=False, repr=False)
    # The read loop's progress, which the deadline watchdog reads, and the
    # error the watchdog cancelled the read loop with.
    watch: FrameWatch = field(default_factory=FrameWatch, repr=False)
    expired: LedgerMQError | None = field(default=None, repr=False)
    watchdog: asyncio.TimerHandle | None = field(default=None, repr=False)


# `handler(body, connection)` gives the response body through an awaitable:
# an `async def` handler's coroutine, or a future (see RpcServer._start).
Handler = Callable[[Any, Connection], Awaitable[Any]]


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

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and start accepting; port 0 picks a free port. Returns the bound address."""
        # Frame buffers must give their memory back when freed (limits.py).
        map_large_allocations()
        self._server = await asyncio.start_server(
            self._on_connect, host, port, ssl=self.ssl,
            ssl_handshake_timeout=self.handshake_timeout if self.ssl is not None else None)
        return self.address

    async def close(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to `grace` seconds),
        deliver their responses, then close every connection."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in list(self._connections) if c.task is not None]
        for conn in list(self._connections):
            if conn.reading and conn.task is not None:
                # Cancelling interrupts only the wait for the next request; the
                # connection's cleanup still waits for its in-flight handlers.
                conn.task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 1.0)
        if self._server is not None:
            await self._server.wait_closed()

    # ----------------------------------------------------------- connection

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        conn = Connection(peer=_fmt_addr(peername))
        conn.writer = FrameWriter(writer, compress_threshold=self.compress_threshold)
        if self._closing:
            await conn.writer.close()
            return
        address = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        refused = self.caps.admit(address)
        if refused is not None:
            await self._refuse_connection(conn, reader, address, refused)
            return
        try:
            # The connection runs in its own task so that close() can cancel it
            # without cancelling the task asyncio.start_server made: Python 3.11's
            # streams callback calls exception() on that task and logs a spurious
            # CancelledError traceback if it ends cancelled.
            conn.task = asyncio.create_task(self._serve(conn, reader))
            self._connections.add(conn)
            with contextlib.suppress(asyncio.CancelledError):
                await conn.task
        finally:
            self.caps.release(address)

    async def _refuse_connection(self, conn: Connection, reader: asyncio.StreamReader,
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

    def _linger(self, conn: Connection, reader: asyncio.StreamReader) -> bool:
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

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        fatal: LedgerMQError | None = None
        fatal_id = CONNECTION_ERROR_ID
        limit = asyncio.Semaphore(self.max_inflight)
        conn.reading = True
        read_timeout = self.limits.frame_read_timeout
        try:
            try:
                # Before the handshake a frame may only be small: a stranger
                # must not make the server buffer megabytes.
                hello_guard = FrameGuard(self.limits.max_handshake_frame_bytes, self.budget,
                                         read_timeout)
                async with asyncio.timeout(self.handshake_timeout):
                    with guarded_reads(hello_guard):
                        await self._handshake(reader, conn)
            except TimeoutError:
                raise HandshakeRequiredError(
                    f"no HELLO within {self.handshake_timeout:g}s"
                ) from None
            guard = FrameGuard(self.max_frame_bytes, self.budget, read_timeout)
            watch, writer = conn.watch, conn.writer
            assert writer is not None
            clock = asyncio.get_running_loop().time
            self._watch_deadlines(conn)
            while True:
                # Deadlines (idle, frame read) are the watchdog's: no timer
                # per frame.
                watch.since = clock()
                first = await reader.read(1)
                if not first:
                    break
                watch.reading, watch.since = True, clock()
                if writer.backlogged:
                    # Answers pile up unread: stop reading until they drain,
                    # rather than queue without bound (a request answered from
                    # a future does not wait for the drain itself).
                    await writer.drain()
                # Until a connection has authenticated on a server that requires
                # it, its frames stay as small as the handshake's: a stranger's
                # PING bomb costs the server no more than a HELLO.
                unproven = self.require_auth and conn.principal is None
                frame = await read_held_frame(reader, hello_guard if unproven else guard,
                                              first, watch)
                watch.reading = False
                if frame is None:
                    break
                try:
                    request = decode_request(frame.payload)
                    # The request holds the decoded body now; the frame only
                    # keeps its reservation until the answer is sent.
                    frame.payload = b""
                    # Backpressure: stop reading, rather than queue without bound,
                    # while this connection already has max_inflight requests running.
                    await limit.acquire()
                except BaseException:
                    self._release(frame)
                    raise
                self._start(conn, request, limit, frame)
                # The handler owns the request now: this frame must not keep
                # its body alive while it waits, maybe minutes, for the next one.
                del request, frame
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
                conn.task.cancel()
                return
            conn.watchdog = loop.call_at(deadline, check)

        first = min(t for t in (idle, read_timeout) if t is not None)
        conn.watchdog = loop.call_at(loop.time() + first, check)

    def _release(self, frame: HeldFrame) -> None:
        """A request was answered (or never ran): its frame's bytes go back to
        the budget; once the budget drains after large frames, the freed heap
        goes back to the system so RSS returns to its baseline after a flood."""
        if frame.held > SMALL_FRAME_BYTES:
            self._large_since_trim = True
        frame.release()
        self._trim_if_drained()

    def _trim_if_drained(self) -> None:
        if self._large_since_trim and self.budget.used == 0:
            self._large_since_trim = False
            release_free_memory()

    async def _finish(self, conn: Connection, fatal: LedgerMQError | None, fatal_id: int) -> None:
        assert conn.writer is not None
        try:
            # Requests read before the error or shutdown still get their answers.
            if conn.inflight:
                await asyncio.wait(list(conn.inflight), timeout=5.0)
            for t in list(conn.inflight):
                t.cancel()
            if fatal is not None:
                log.info("%s: closing %s: %s", self.name, conn.peer, fatal)
                conn.writer.send(encode_response(error_response(fatal_id, fatal)))
            await conn.writer.close()
        finally:
            self._connections.discard(conn)

    async def _handshake(self, reader: asyncio.StreamReader, conn: Connection) -> None:
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
        if conn.reading and conn.task is not None:
            # Stops reading; the connection's cleanup still answers what was read.
            conn.task.cancel()

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

    def _start(self, conn: Connection, request: Request, limit: asyncio.Semaphore,
               frame: HeldFrame) -> None:
        """Call the request's handler here in the read loop (AUTH, answered
        by `_gate`, sets the principal before the next frame is read). A
        plain handler's checks raise at once and its future is answered from
        a done callback; an `async def` handler's coroutine runs in a task of
        its own."""
        release = partial(_finished, self, conn, limit, frame)
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
        if error is None:
            response = Response(rid, body=result)
        else:
            if not isinstance(error, LedgerMQError):
                log.error("%s: handler for code %d failed", self.name, code, exc_info=error)
            response = error_response(rid, error)
        self._observe(handler, code, started, error, result)
        try:
            payload = encode_response(response)
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


def _finished(server: RpcServer, conn: Connection, limit: asyncio.Semaphore, frame: HeldFrame,
              pending: asyncio.Future[Any] | None) -> None:
    """A request was answered (or its task ended): forget it, free its
    frame's budget and let the connection read one more."""
    if pending is not None:
        conn.inflight.discard(pending)
    limit.release()
    server._release(frame)


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


# --------------------------------------------------------------------------- client


def _expire_request(fut: asyncio.Future[Response], rid: int, code: int, peer: str,
                    wait: float) -> None:
    """A request's deadline passed: its caller gets RequestTimeoutError (a
    late response is then discarded by the read loop)."""
    if not fut.done():
        fut.set_exception(RequestTimeoutError(
            f"no response to request {rid} (code {code}) from {peer} within {wait:g}s"))


class RpcClient:
    """One client connection. Create with `await RpcClient.connect(...)`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        timeout: float,
        max_frame_bytes: int,
        compress_threshold: int | None,
    ) -> None:
        self._reader = reader
        self._writer = FrameWriter(writer, compress_threshold=compress_threshold)
        self.timeout = timeout
        self.max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._closed_error: BaseException | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.server_info: dict[str, Any] = {}
        self.peer = _fmt_addr(writer.get_extra_info("peername"))

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        role: str = "client",
        name: str | None = None,
        version: int = PROTOCOL_VERSION,
        timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
        credentials: Credentials | None = None,
        ssl: ssl_module.SSLContext | None = None,
        server_hostname: str | None = None,
        require_server_auth: bool = True,
    ) -> RpcClient:
        """Connect and complete the HELLO handshake, or raise (the typed error the
        server sent, RequestTimeoutError, or OSError from connect).

        With `credentials`, authenticate (AUTH) and check the server's proof:
        UnauthenticatedError if the server refuses them, fails its own proof
        (it does not know the secret: not the server it claims to be) or, with
        `require_server_auth` (the default), offers no authentication at all.
        `ssl`: connect with TLS, checking the certificate against
        `server_hostname` (default: `host`)."""
        try:
            async with asyncio.timeout(timeout):
                if ssl is None:
                    reader, writer = await asyncio.open_connection(host, port)
                else:
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=ssl, server_hostname=server_hostname or host)
        except TimeoutError:
            raise RequestTimeoutError(f"connect to {host}:{port} timed out") from None
        client = cls(
            reader,
            writer,
            timeout=timeout,
            max_frame_bytes=max_frame_bytes,
            compress_threshold=compress_threshold,
        )
        client._reader_task = asyncio.create_task(client._read_loop())
        try:
            info = await client.request(RequestCode.HELLO, hello_body(role, version, name))
            client.server_info = info if isinstance(info, dict) else {}
            if credentials is not None:
                await client._authenticate(credentials, f"{role}:{name or ''}",
                                           require_server_auth)
        except (Exception, asyncio.CancelledError):
            await client.close()
            raise
        except GeneratorExit:
            # Closed without running (garbage-collected after its loop
            # stopped): nothing may be awaited now, so let go without waiting.
            with contextlib.suppress(RuntimeError):  # the loop may be closed
                client._reader_task.cancel()
                writer.close()
            raise
        return client

    async def _authenticate(self, credentials: Credentials, claim: str,
                            require_server_auth: bool) -> None:
        """AUTH with `credentials` against the HELLO answer's challenge and
        check the server's proof."""
        auth = self.server_info.get("auth")
        challenge = auth.get("challenge") if isinstance(auth, dict) else None
        if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
            if not require_server_auth:
                return
            # The caller asked to authenticate; a server that cannot (an open
            # one, or an impostor that skips the challenge) must not be trusted
            # with the messages as if it were the authenticated cluster.
            raise UnauthenticatedError(
                f"{self.peer} ({self.server_info.get('server', '?')}) offers no authentication;"
                " credentials were given, so it is not trusted")
        nonce = new_challenge()
        reply = await self.request(RequestCode.AUTH, {
            "access_key": credentials.access_key, "nonce": nonce,
            "proof": client_proof(credentials.secret, challenge, nonce, claim)})
        expected = server_proof(credentials.secret, challenge, nonce, claim)
        if not isinstance(reply, dict) or not proof_matches(expected, reply.get("proof")):
            raise UnauthenticatedError(
                f"{self.peer} accepted AUTH but could not prove it knows the secret of"
                f" {credentials.access_key!r}: it is not the server it claims to be")

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    @property
    def server_version(self) -> int | None:
        return self.server_info.get("version")

    async def request(self, code: int, body: Any = None, *, timeout: float | None = None) -> Any:
        """Send one request and return the response body, or raise its typed error.

        RequestTimeoutError if no response within `timeout` (default: the
        client's); ConnectionClosedError if the connection ends first. A late
        response after a timeout is discarded.
        """
        if self._closed_error is not None:
            raise ConnectionClosedError(f"connection to {self.peer} is closed") from (
                self._closed_error
            )
        rid = next(self._ids)
        if rid > MAX_REQUEST_ID:  # pragma: no cover - 2**63 requests on one connection
            raise ConnectionClosedError("request ids exhausted; reconnect")
        payload = encode_request(Request(rid, int(code), body))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        self._pending[rid] = fut
        self._writer.send(payload)
        wait = self.timeout if timeout is None else timeout
        # The deadline is a timer that fails the future (one handle per
        # request, the per-message path), not an asyncio.timeout scope; nor
        # wait_for, whose Python 3.11 version returns the result when the
        # response lands in the same loop pass as a cancellation of the
        # caller, swallowing the cancellation (a consumer's stop() then
        # waited forever for a heartbeat loop). Awaiting the future itself
        # passes a cancellation straight through.
        timer = loop.call_later(wait, _expire_request, fut, rid, int(code), self.peer, wait)
        try:
            response = await fut
        finally:
            timer.cancel()
            self._pending.pop(rid, None)
        if not response.ok:
            raise error_from_response(response.status, response.error, response.body)
        return response.body

    async def _read_loop(self) -> None:
        reason: BaseException = ConnectionClosedError(f"connection to {self.peer} closed")
        abandoned = False
        try:
            while True:
                payload = await read_frame(self._reader, self.max_frame_bytes)
                if payload is None:
                    break
                response = decode_response(payload)
                if response.id == CONNECTION_ERROR_ID:
                    # The server is about to close: every pending request fails
                    # with the reason it gave.
                    reason = error_from_response(response.status, response.error, response.body)
                    break
                fut = self._pending.get(response.id)
                if fut is not None and not fut.done():
                    fut.set_result(response)
        except (LedgerMQError, ConnectionError, OSError) as exc:
            reason = exc
        except asyncio.CancelledError:
            reason = ConnectionClosedError(f"connection to {self.peer} closed locally")
        except GeneratorExit:
            # Closed by the garbage collector after its loop stopped: nothing
            # may be awaited or scheduled now; the socket goes with its transport.
            abandoned = True
            raise
        finally:
            if not abandoned:
                self._fail_all(reason)
                await self._writer.close()

    def _fail_all(self, reason: BaseException) -> None:
        if self._closed_error is None:
            self._closed_error = reason
        for fut in self._pending.values():
            if not fut.done():
                if isinstance(reason, LedgerMQError):
                    fut.set_exception(reason)
                else:
                    exc = ConnectionClosedError(str(reason))
                    exc.__cause__ = reason
                    fut.set_exception(exc)
        self._pending.clear()

    async def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionClosedError."""
        task = self._reader_task
        if task is not None and not task.done():
            await cancel_and_wait([task])
        else:
            self._fail_all(ConnectionClosedError(f"connection to {self.peer} closed locally"))
            await self._writer.close()

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
