"""Pure encode/decode of LedgerMQ frames and messages: no sockets, no event loop.

Frame layout (docs/protocol.md):

    +----------------+---------+----------------------+
    | length: u32 BE | flags:u8| payload: length bytes |
    +----------------+---------+----------------------+

`length` counts payload bytes only. Flag bit 0 (FLAG_ZSTD) marks a payload
compressed with zstandard; every other bit is reserved and must be zero, so a
peer speaking a future framing is rejected instead of misread. The payload,
once decompressed, is one msgpack map: a request {id, code, body} or a response
{id, status, error, body}.

Everything here is a plain function over bytes so that it can be unit-tested and
fuzzed; `FrameDecoder` is the incremental (sans-I/O) form used by code that gets
bytes in arbitrary chunks.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import msgpack
import zstandard

from ledgermq.base.errors import (
    OK,
    ErrorCode,
    FrameTooLargeError,
    LedgerMQError,
    MalformedFrameError,
)

PROTOCOL_VERSION = 1
# Versions this build can speak. A server answers HELLO with an error for
# anything outside this set; when version 2 appears, keep 1 here while old
# clients exist.
SUPPORTED_VERSIONS: frozenset[int] = frozenset({PROTOCOL_VERSION})

HEADER = struct.Struct(">IB")
HEADER_SIZE = HEADER.size
FLAG_ZSTD = 0x01
_KNOWN_FLAGS = FLAG_ZSTD

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
# Below this size compression costs more CPU than the bytes it saves.
DEFAULT_COMPRESS_THRESHOLD = 64 * 1024
ZSTD_LEVEL = 3

# Request id 0 is reserved for connection-level errors sent by a server (a bad
# frame has no trustworthy id); clients number requests from 1.
CONNECTION_ERROR_ID = 0
MAX_REQUEST_ID = 2**63 - 1
# Request codes and response statuses are small non-negative numbers; a peer's
# value beyond the i32 range is refused as malformed.
MAX_CODE = 2**31 - 1

# zstandard contexts are not safe to share between threads; asyncio code runs
# on one thread, but an executor may compress a large batch off-loop.
_local = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    ctx = getattr(_local, "cctx", None)
    if ctx is None:
        # write_content_size lets the receiver check the decompressed size
        # against its limit before allocating anything.
        ctx = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return ctx


def _dctx() -> zstandard.ZstdDecompressor:
    ctx = getattr(_local, "dctx", None)
    if ctx is None:
        ctx = _local.dctx = zstandard.ZstdDecompressor()
    return ctx


# --------------------------------------------------------------------------- frames


def encode_frame(
    payload: bytes,
    *,
    compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
) -> bytes:
    """Frame one payload, zstd-compressing it when it is at least `compress_threshold`
    bytes and compression actually shrinks it. `None` disables compression."""
    flags = 0
    if compress_threshold is not None and len(payload) >= compress_threshold:
        packed = _cctx().compress(payload)
        if len(packed) < len(payload):
            payload, flags = packed, FLAG_ZSTD
    return HEADER.pack(len(payload), flags) + payload


def encode_frames(
    payloads: Iterable[bytes],
    *,
    compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
) -> bytes:
    """Several frames concatenated, ready for one write."""
    return b"".join(encode_frame(p, compress_threshold=compress_threshold) for p in payloads)


def decode_header(header: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[int, int]:
    """Validate a 5-byte frame header; return (payload length, flags).

    Raises FrameTooLargeError before anything reads the payload, so a hostile
    length cannot make the receiver allocate or wait for it.
    """
    if len(header) != HEADER_SIZE:
        raise MalformedFrameError(f"frame header is {HEADER_SIZE} bytes, got {len(header)}")
    length, flags = HEADER.unpack(header)
    if flags & ~_KNOWN_FLAGS:
        raise MalformedFrameError(f"unknown frame flags 0x{flags:02x}")
    if length > max_frame_bytes:
        raise FrameTooLargeError(
            f"frame payload of {length} bytes exceeds the limit of {max_frame_bytes}"
        )
    return length, flags


def declared_size(raw: bytes | bytearray, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """The decompressed size a compressed payload declares in its zstd frame
    header, checked against `max_frame_bytes` before anything is decompressed."""
    try:
        size = zstandard.frame_content_size(raw)
    except zstandard.ZstdError as exc:
        raise MalformedFrameError(f"bad zstd frame header: {exc}") from None
    # A compressed frame must declare its size: otherwise a few bytes could
    # expand without bound (a decompression bomb) before we could check.
    if size < 0:
        raise MalformedFrameError("compressed payload does not declare its content size")
    if size > max_frame_bytes:
        raise FrameTooLargeError(
            f"decompressed payload of {size} bytes exceeds the limit of {max_frame_bytes}"
        )
    return int(size)


def decompress_exact(raw: bytes | bytearray, size: int) -> bytes:
    """Decompress a payload that declared `size` (see `declared_size`).

    The output buffer is exactly `size` bytes and zstd refuses to write past
    it, so a header that understates the content cannot make it allocate more:
    the cap holds during decompression, not only before it.
    """
    try:
        out = _dctx().decompress(raw, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise MalformedFrameError(f"corrupt zstd payload: {exc}") from None
    if len(out) != size:
        raise MalformedFrameError("zstd payload size does not match its header")
    return out


def decode_payload(flags: int, raw: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Undo the frame's compression, enforcing the size limit on the result too."""
    if not flags & FLAG_ZSTD:
        return bytes(raw)
    return decompress_exact(raw, declared_size(raw, max_frame_bytes))


def decode_frame(
    data: bytes | bytearray | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[bytes, int] | None:
    """Decode the first frame of `data`: (payload, bytes consumed), or None if
    `data` does not yet hold a whole frame."""
    if len(data) < HEADER_SIZE:
        return None
    length, flags = decode_header(bytes(data[:HEADER_SIZE]), max_frame_bytes)
    end = HEADER_SIZE + length
    if len(data) < end:
        return None
    return decode_payload(flags, bytes(data[HEADER_SIZE:end]), max_frame_bytes), end


class FrameDecoder:
    """Incremental frame decoder: feed bytes as they arrive, get whole payloads.

    After an error the decoder is poisoned (the stream position is unknown), and
    every further feed raises the same error; the connection must be closed.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame. Non-zero at EOF means
        the peer sent a truncated frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise self._error
        self._buf += data
        out: list[bytes] = []
        pos = 0
        try:
            while True:
                view = memoryview(self._buf)[pos:]
                try:
                    got = decode_frame(view, self.max_frame_bytes)
                finally:
                    view.release()
                if got is None:
                    break
                payload, used = got
                out.append(payload)
                pos += used
        except (MalformedFrameError, FrameTooLargeError) as exc:
            self._error = exc
            raise
        finally:
            del self._buf[:pos]
        return out


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Request:
    """A request: `id` chosen by the sender to match the response, `code` from
    ledgermq.base.codes.RequestCode, `body` any msgpack value."""

    id: int
    code: int
    body: Any = None


@dataclass(frozen=True, slots=True)
class Response:
    """A response: `status` is 0 (OK) or an ErrorCode; `error` is the message
    for humans; `body` is the result, or error details (NOT_LEADER's leader)."""

    id: int
    status: int = OK
    error: str | None = None
    body: Any = None

    @property
    def ok(self) -> bool:
        return self.status == OK


# The msgpack maps of docs/protocol.md, field for field, in the order they are
# packed (a dict's order is its order on the wire).


class RequestMap(TypedDict):
    """A request payload: {id, code, body}."""

    id: int
    code: int
    body: Any


class ResponseMap(TypedDict):
    """A response payload: {id, status, error, body}."""

    id: int
    status: int
    error: str | None
    body: Any


class HelloBody(TypedDict):
    """The body of the HELLO request: {version, role[, name]}."""

    version: int
    role: str
    name: NotRequired[str]


class HelloReply(TypedDict):
    """The body of the server's answer to HELLO."""

    version: int
    server: str
    max_frame_bytes: int
    # Only from a server that authenticates: {"challenge": 16 bytes} (AUTH).
    auth: NotRequired[dict[str, bytes]]


# One Packer for every payload: `msgpack.packb` builds (and frees) a Packer
# and its buffer per call, about half of a small payload's encoding time. Its
# `pack` runs no Python code (no `default` hook), so it holds the GIL from
# start to end: no other thread can interleave, and an error resets it.
_PACK = msgpack.Packer(use_bin_type=True).pack


def _pack(obj: RequestMap | ResponseMap) -> bytes:
    try:
        packed: bytes = _PACK(obj)
        return packed
    except (TypeError, ValueError, OverflowError) as exc:
        # The sender's own bug, not the peer's: say which value did not fit.
        raise TypeError(f"value cannot be encoded as msgpack: {exc}") from exc


def _unpack(payload: bytes | bytearray) -> dict[Any, Any]:
    try:
        # strict_map_key=False: bodies may key maps by int (queue id -> offset).
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types (ExtraData, StackError, ...)
        raise MalformedFrameError(f"payload is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise MalformedFrameError(f"payload must be a map, got {type(obj).__name__}")
    return obj


def _int_field(obj: dict[Any, Any], key: str, lo: int, hi: int) -> int:
    value = obj.get(key)
    # bool is an int subclass; a True id is a bug in the peer, not id 1.
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise MalformedFrameError(f"field {key!r} must be an integer in [{lo}, {hi}]")
    return value


def encode_request(request: Request) -> bytes:
    """Msgpack payload of a request (not yet framed)."""
    return _pack(RequestMap(id=request.id, code=request.code, body=request.body))


def decode_request(payload: bytes | bytearray) -> Request:
    """Parse a request payload; MalformedFrameError if it is not {id, code, body}."""
    obj = _unpack(payload)
    rid, code = obj.get("id"), obj.get("code")
    # Both checks at once (every request comes here); `_int_field` names the
    # field that fails. `type(...) is int`: a bool is no id. Id 0 would
    # collide with connection-level error responses.
    if not (type(rid) is int and 1 <= rid <= MAX_REQUEST_ID
            and type(code) is int and 0 <= code <= MAX_CODE):
        rid = _int_field(obj, "id", 1, MAX_REQUEST_ID)
        code = _int_field(obj, "code", 0, MAX_CODE)
    return Request(rid, code, obj.get("body"))


def encode_response(response: Response) -> bytes:
    """Msgpack payload of a response (not yet framed)."""
    return _pack(
        ResponseMap(
            id=response.id, status=response.status, error=response.error, body=response.body
        )
    )


def encode_result(request_id: int, body: Any) -> bytes:
    """`encode_response` of an OK response carrying `body`, without the
    Response (every answered request comes here)."""
    return _pack(ResponseMap(id=request_id, status=OK, error=None, body=body))


def decode_response(payload: bytes) -> Response:
    """Parse a response payload; MalformedFrameError if the shape is wrong."""
    obj = _unpack(payload)
    rid, status = obj.get("id"), obj.get("status")
    if not (type(rid) is int and 0 <= rid <= MAX_REQUEST_ID
            and type(status) is int and 0 <= status <= MAX_CODE):
        rid = _int_field(obj, "id", 0, MAX_REQUEST_ID)
        status = _int_field(obj, "status", 0, MAX_CODE)
    error = obj.get("error")
    if error is not None and not isinstance(error, str):
        raise MalformedFrameError("field 'error' must be a string or nil")
    return Response(rid, status, error, obj.get("body"))


def error_response(request_id: int, exc: Exception) -> Response:
    """The response that reports `exc` (a LedgerMQError, or anything else as INTERNAL)."""
    if isinstance(exc, LedgerMQError):
        return Response(request_id, exc.code, exc.message, exc.data)
    return Response(request_id, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", None)


# --------------------------------------------------------------------------- handshake


def hello_body(role: str, version: int = PROTOCOL_VERSION, name: str | None = None) -> HelloBody:
    """Body of the HELLO request a client sends first on every connection."""
    body = HelloBody(version=version, role=role)
    if name is not None:
        body["name"] = name
    return body
