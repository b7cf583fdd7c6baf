"""The RPC client: one connection to a LedgerMQ server.

`request()` sends and waits for the response with the same id, returning its
body or raising the typed LedgerMQError. Reconnecting is left to the caller
(a producer fails over to another broker, a broker to another NameServer),
which knows better than this layer what to retry.

Responses are parsed where their bytes arrive (`FrameProtocol.serve`): each
resolves its request's future in the pass that read it, with no read task,
no StreamReader and no task step per response (the per-message path,
docs/architecture.md). Requests queued in one loop pass go out in one write
(`FrameWriter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl as ssl_module
from typing import Any

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ConnectionClosedError,
    InvalidRequestError,
    LedgerMQError,
    MalformedFrameError,
    RequestTimeoutError,
    UnauthenticatedError,
    error_from_response,
)
from ledgermq.wire.auth import (
    CHALLENGE_BYTES,
    Credentials,
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
    Request,
    Response,
    decode_response,
    encode_request,
    hello_body,
)
from ledgermq.wire.frame_protocol import FrameProtocol
from ledgermq.wire.streams import FrameWriter


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


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
        conn: FrameProtocol,
        *,
        timeout: float,
        max_frame_bytes: int,
        compress_threshold: int | None,
    ) -> None:
        assert conn.transport is not None
        self._conn = conn
        self._writer = FrameWriter(
            asyncio.StreamWriter(conn.transport, conn, None, asyncio.get_running_loop()),
            compress_threshold=compress_threshold)
        self.timeout = timeout
        self.max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._closed_error: BaseException | None = None
        self.server_info: dict[str, Any] = {}
        self.peer = _fmt_addr(conn.peername())

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
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: FrameProtocol(lambda _: None), host, port, ssl=ssl,
                    server_hostname=(server_hostname or host) if ssl is not None else None)
        except TimeoutError:
            raise RequestTimeoutError(f"connect to {host}:{port} timed out") from None
        client = cls(
            conn,
            timeout=timeout,
            max_frame_bytes=max_frame_bytes,
            compress_threshold=compress_threshold,
        )
        conn.serve(client._on_frame, max_frame_bytes)
        conn.on_close(client._on_closed)
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
                conn.abort()
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
        try:
            payload = encode_request(Request(rid, int(code), body))
        except TypeError as exc:
            # A value of the caller's that msgpack cannot carry (an integer
            # beyond 64 bits, an object): the request is refused here, unsent,
            # as the server refuses one beyond its own ranges.
            raise InvalidRequestError(str(exc)) from exc
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

    def _on_frame(self, payload: bytes) -> None:
        """One response, in the pass that read it (a malformed one raises,
        and the connection closes with that error)."""
        response = decode_response(payload)
        if response.id == CONNECTION_ERROR_ID:
            # The server is about to close: every pending request fails with
            # the reason it gave.
            self._fail_all(error_from_response(response.status, response.error, response.body))
            self._conn.close()
            return
        fut = self._pending.get(response.id)
        if fut is not None and not fut.done():
            fut.set_result(response)

    def _on_closed(self, error: BaseException | None) -> None:
        if isinstance(error, MalformedFrameError) and not self.server_info:
            # Not even the answer to HELLO was a frame: most likely another
            # kind of server at this address (HTTP, SSH, the admin port), which
            # a bare "unknown frame flags 0x2f" would not tell the user.
            error = MalformedFrameError(
                f"{self.peer} does not answer as a LedgerMQ server (its answer to HELLO"
                f" is not a LedgerMQ frame: {error.message})")
        self._fail_all(error if error is not None
                       else ConnectionClosedError(f"connection to {self.peer} closed"))

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
        self._fail_all(ConnectionClosedError(f"connection to {self.peer} closed locally"))
        await self._writer.close()

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
