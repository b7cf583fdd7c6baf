"""A hand-driven client for attack tests: what a hostile peer writes, byte
for byte, and how it reads the server's answers (tests/security,
tests/ledgermq/wire/test_limits.py). Over plain TCP or, against a server
with TLS on, over TLS as an attacker would: no client certificate, the
server's certificate not checked (`attacker_tls`)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import zstandard

from ledgermq.base.codes import RequestCode
from ledgermq.wire import Request, decode_response, encode_frame, encode_request, hello_body
from ledgermq.wire.codec import FLAG_ZSTD, HEADER, Response


def frame(code: int, body: object, rid: int = 1) -> bytes:
    """One uncompressed request frame."""
    return encode_frame(encode_request(Request(rid, code, body)), compress_threshold=None)


def bomb(size: int, rid: int = 2, code: int = RequestCode.PING) -> bytes:
    """A tiny zstd frame (about 500 bytes for 15 MiB) whose payload, a request
    with a `size`-byte body of zeros, decompresses to a little over `size`."""
    payload = encode_request(Request(rid, code, b"\0" * size))
    packed = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(payload)
    return HEADER.pack(len(packed), FLAG_ZSTD) + packed


class Raw:
    """One client socket driven by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: tuple[str, int], hello: bool = True,
                   source: str | None = None, tls: ssl.SSLContext | None = None) -> Raw:
        """Connect (from loopback alias `source` if given, over `tls` if
        given) and say HELLO."""
        reader, writer = await asyncio.open_connection(
            *address, local_addr=(source, 0) if source else None, limit=1 << 20, ssl=tls,
            server_hostname=address[0] if tls else None)
        raw = cls(reader, writer)
        if hello:
            raw.send(frame(RequestCode.HELLO, hello_body("client")))
            assert (await raw.response()).ok
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def response(self) -> Response:
        header = await self.reader.readexactly(HEADER.size)
        length, flags = HEADER.unpack(header)
        body = await self.reader.readexactly(length)
        if flags & FLAG_ZSTD:
            body = zstandard.ZstdDecompressor().decompress(body)
        return decode_response(body)

    async def closed_with(self) -> int:
        """The status of the connection-level error frame (id 0) the server
        sent before closing; then the stream must end."""
        response = await self.response()
        assert response.id == 0, response
        assert await self.reader.read() == b""
        return response.status

    def close(self) -> None:
        self.writer.close()


def attacker_tls(cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A TLS client context that trusts any server and presents `cert_file`
    if given: an attacker needs no CA to talk TLS to a client port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def partial_frame(address: tuple[str, int], size: int, statuses: list[int], *,
                  source: str = "127.0.0.3",
                  tls: ssl.SSLContext | None = None) -> threading.Thread:
    """A thread that says HELLO, then sends a `size`-byte frame's header and
    all of its body but 10 bytes with blocking writes (the kernel's buffers
    are all it can queue once the server stops reading), then reads the
    status of the connection-level error the server closes it with into
    `statuses`."""
    sock: socket.socket = socket.create_connection(address, source_address=(source, 0))
    if tls is not None:
        sock = tls.wrap_socket(sock)
    sock.sendall(frame(RequestCode.HELLO, hello_body("client")))
    body = memoryview(b"x" * (size - 10))

    def run() -> None:
        try:
            length, _ = HEADER.unpack(_recv_exactly(sock, HEADER.size))
            _recv_exactly(sock, length)  # the HELLO answer
            try:
                sock.sendall(HEADER.pack(size, 0))
                sock.sendall(body)
            except OSError:
                pass  # the server closed the connection: its answer is waiting
            data = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except OSError:  # a TLS connection may end without close_notify
                    break
                if not chunk:
                    break
                data += chunk
            length = HEADER.unpack(data[:HEADER.size])[0]
            response = decode_response(data[HEADER.size:HEADER.size + length])
            assert response.id == 0
            statuses.append(response.status)
        finally:
            sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
