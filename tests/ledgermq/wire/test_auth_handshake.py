"""The AUTH handshake over real loopback sockets: mutual proofs, refusals
that close the connection, gating before AUTH, replay, impostor servers and
TLS (docs/protocol.md "Authentication")."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import ConnectionClosedError, UnauthenticatedError
from ledgermq.wire import Connection, RpcClient, RpcServer, encode_response, read_frame
from ledgermq.wire.auth import (
    ANONYMOUS,
    Credentials,
    Principal,
    client_proof,
    new_challenge,
)
from ledgermq.wire.codec import Response, decode_request, encode_frame
from ledgermq.wire.tls import client_context, server_context

WHO = 900
SECRET = b"k" * 32
APP = Principal("app")
GOOD = Credentials("app", SECRET)


class Keys:
    def __init__(self, keys: dict[str, tuple[bytes, Principal]]) -> None:
        self.keys = keys

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        return self.keys.get(access_key)


KEYS = Keys({"app": (SECRET, APP)})


async def _who(body: Any, conn: Connection) -> Any:
    principal = conn.principal
    return None if principal is None else principal.name


def run(test: Callable[[RpcServer, int], Awaitable[None]], **kw: Any) -> RpcServer:
    server = RpcServer("test", {WHO: _who}, **kw)

    async def main() -> None:
        _, port = await server.start("127.0.0.1", 0)
        try:
            await test(server, port)
        finally:
            await server.close(grace=2.0)

    loop.run(main())
    return server


async def _wait_closed(client: RpcClient) -> None:
    for _ in range(200):
        if client.closed:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server did not close the connection")


def test_mutual_authentication_sets_the_principal() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port, name="a",
                                           credentials=GOOD) as c:
            assert await c.request(WHO) == "app"

    server = run(t, key_store=KEYS, require_auth=True)
    assert not server.auth_failures


def test_an_open_server_answers_hello_as_before_and_everyone_is_anonymous() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            # No "auth" key: the same bytes as before the handshake existed.
            assert set(c.server_info) == {"version", "server", "max_frame_bytes"}
            assert await c.request(WHO) == ANONYMOUS.name

    run(t)


@pytest.mark.parametrize("creds", [Credentials("app", b"w" * 32), Credentials("nobody", SECRET)])
def test_a_wrong_secret_or_unknown_key_is_refused_logged_and_counted(
        creds: Credentials, caplog: pytest.LogCaptureFixture) -> None:
    async def t(server: RpcServer, port: int) -> None:
        with pytest.raises(UnauthenticatedError, match="unknown access key or wrong secret"):
            await RpcClient.connect("127.0.0.1", port, credentials=creds)
        # The server is still up for the right credentials.
        async with await RpcClient.connect("127.0.0.1", port, credentials=GOOD) as c:
            assert await c.request(WHO) == "app"

    with caplog.at_level(logging.WARNING, logger="ledgermq.wire.rpc"):
        server = run(t, key_store=KEYS, require_auth=True)
    reason = "bad_proof" if creds.access_key == "app" else "unknown_key"
    assert server.auth_failures == {reason: 1}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1
    assert "127.0.0.1" in lines[0] and repr(creds.access_key) in lines[0]
    assert creds.secret.decode() not in lines[0]


def test_requests_before_auth_are_refused_and_the_connection_closed() -> None:
    async def t(server: RpcServer, port: int) -> None:
        c = await RpcClient.connect("127.0.0.1", port)  # no credentials
        try:
            assert await c.request(RequestCode.PING, "p") == "p"  # allowed before AUTH
            with pytest.raises(UnauthenticatedError, match="requires authentication"):
                await c.request(WHO)
            await _wait_closed(c)
            with pytest.raises(ConnectionClosedError):
                await c.request(RequestCode.PING, "p")
        finally:
            await c.close()

    server = run(t, key_store=KEYS, require_auth=True)
    assert server.auth_failures == {"no_auth": 1}


def test_without_require_auth_a_client_may_stay_anonymous_or_authenticate() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            assert "challenge" in c.server_info["auth"]
            assert await c.request(WHO) == ANONYMOUS.name
        async with await RpcClient.connect("127.0.0.1", port, credentials=GOOD) as c:
            assert await c.request(WHO) == "app"

    run(t, key_store=KEYS)


def test_a_request_pipelined_right_after_auth_sees_its_result() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port, name="p") as c:
            challenge = c.server_info["auth"]["challenge"]
            nonce = new_challenge()
            auth = {"access_key": "app", "nonce": nonce,
                    "proof": client_proof(SECRET, challenge, nonce, "client:p")}
            # Both written before either is answered.
            _, who = await asyncio.gather(c.request(RequestCode.AUTH, auth), c.request(WHO))
            assert who == "app"

    run(t, key_store=KEYS, require_auth=True)


def test_a_replayed_auth_is_refused_on_a_new_connection() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as first:
            challenge = first.server_info["auth"]["challenge"]
            nonce = new_challenge()
            recorded = {"access_key": "app", "nonce": nonce,
                        "proof": client_proof(SECRET, challenge, nonce, "client:")}
            assert "proof" in await first.request(RequestCode.AUTH, recorded)
            # A second AUTH on the same connection is refused too.
            with pytest.raises(UnauthenticatedError, match="once per connection"):
                await first.request(RequestCode.AUTH, recorded)
        async with await RpcClient.connect("127.0.0.1", port) as second:
            with pytest.raises(UnauthenticatedError):
                await second.request(RequestCode.AUTH, recorded)
            await _wait_closed(second)

    server = run(t, key_store=KEYS, require_auth=True)
    assert server.auth_failures == {"repeated": 1, "bad_proof": 1}


@pytest.mark.parametrize("body", [None, "x", {"access_key": "app"},
                                  {"access_key": "app", "nonce": b"short", "proof": b""},
                                  {"access_key": "a" * 500, "nonce": b"n" * 16, "proof": b""}])
def test_a_malformed_auth_is_refused(body: Any) -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            with pytest.raises(UnauthenticatedError, match="AUTH body"):
                await c.request(RequestCode.AUTH, body)
            await _wait_closed(c)

    server = run(t, key_store=KEYS, require_auth=True)
    assert server.auth_failures == {"malformed": 1}


# ------------------------------------------------------------ impostor servers


async def _impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    challenge: bool) -> None:
    """Answers HELLO (with a challenge or none) and accepts any AUTH with a
    proof it cannot have made: a server that does not know the secret."""
    try:
        while (payload := await read_frame(reader, 1 << 20)) is not None:
            request = decode_request(payload)
            if request.code == RequestCode.HELLO:
                body: Any = {"version": 1, "server": "impostor", "max_frame_bytes": 1 << 20}
                if challenge:
                    body["auth"] = {"challenge": new_challenge()}
            elif request.code == RequestCode.AUTH:
                body = {"proof": b"\0" * 32}
            else:
                body = {"ok": True}
            writer.write(encode_frame(encode_response(Response(request.id, body=body))))
    finally:
        writer.close()


@pytest.mark.parametrize("challenge", [True, False])
def test_a_client_with_credentials_detects_a_server_that_cannot_prove_itself(
        challenge: bool) -> None:
    async def main() -> None:
        fake = await asyncio.start_server(
            lambda r, w: _impostor(r, w, challenge), "127.0.0.1", 0)
        port = fake.sockets[0].getsockname()[1]
        try:
            match = "could not prove" if challenge else "offers no authentication"
            with pytest.raises(UnauthenticatedError, match=match):
                await RpcClient.connect("127.0.0.1", port, credentials=GOOD)
            if not challenge:
                # Explicitly told that an unauthenticated server is fine.
                c = await RpcClient.connect("127.0.0.1", port, credentials=GOOD,
                                            require_server_auth=False)
                await c.close()
        finally:
            fake.close()
            await fake.wait_closed()

    loop.run(main())


# ----------------------------------------------------------------------- TLS


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (str(tmp_path / n) for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(ca_file)
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    return server_context(cert_file, key_file), client_context(ca_file)


def test_tls_with_authentication(tmp_path: Path) -> None:
    server_tls, client_tls = _tls(tmp_path)
    (tmp_path / "other").mkdir()
    other_tls = _tls(tmp_path / "other")[1]

    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port, credentials=GOOD,
                                           ssl=client_tls) as c:
            assert await c.request(WHO) == "app"
        # A CA that did not sign the server's certificate: refused by the client.
        with pytest.raises(ssl.SSLCertVerificationError):
            await RpcClient.connect("127.0.0.1", port, credentials=GOOD, ssl=other_tls)
        # Plain TCP against the TLS port gets no HELLO answer it can read.
        with pytest.raises((ConnectionClosedError, ConnectionError, OSError)):
            await RpcClient.connect("127.0.0.1", port, credentials=GOOD, timeout=2.0)

    run(t, key_store=KEYS, require_auth=True, ssl=server_tls)


@pytest.mark.parametrize("body", [b"x" * (1 << 20), bytes(range(256)) * 4096],
                         ids=["compressible", "incompressible"])
def test_frames_before_auth_are_as_small_as_the_handshakes(body: bytes) -> None:
    """On a server that requires authentication, a stranger cannot make it
    buffer or decompress a large frame (a PING bomb): before AUTH a frame is
    capped like HELLO; after AUTH the same PING is echoed."""
    from ledgermq.base.errors import FrameTooLargeError

    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as stranger:
            with pytest.raises((FrameTooLargeError, ConnectionClosedError)):
                await stranger.request(RequestCode.PING, body)
            await _wait_closed(stranger)
        async with await RpcClient.connect("127.0.0.1", port, credentials=GOOD) as member:
            assert await member.request(RequestCode.PING, body) == body

    run(t, key_store=KEYS, require_auth=True)
