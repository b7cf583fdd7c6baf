"""A hand-driven client for attack tests: what a hostile peer writes, byte
for byte, and how it reads the server's answers (tests/security,
tests/ledgermq/wire/test_limits.py)."""

from __future__ import annotations

import asyncio

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
                   source: str | None = None) -> Raw:
        """Connect (from loopback alias `source` if given) and say HELLO."""
        reader, writer = await asyncio.open_connection(
            *address, local_addr=(source, 0) if source else None, limit=1 << 20)
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
