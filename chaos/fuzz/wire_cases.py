"""Cases for the client protocol port (brokers and the NameServer share it).

From the outside in: raw random bytes; frame headers with reserved flags,
huge declared lengths or truncated payloads; corrupt zstd; payloads that are
not msgpack or not a request map; HELLOs with wrong versions and roles; and,
after a valid HELLO, requests of every code (`RequestCode`, plus unknown
codes) with structure-aware bodies from `bodies`. Each generator returns a
`Plan`; which of them apply to which port is `cases.GENERATORS`.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import msgpack
import zstandard

from chaos.fuzz.bodies import body_for
from chaos.fuzz.plan import Context, Plan
from chaos.fuzz.values import deep_nesting, extreme_int, random_value
from ledgermq.base.codes import RequestCode
from ledgermq.wire.codec import FLAG_ZSTD, HEADER, encode_frame, hello_body

ALL_CODES: tuple[int, ...] = tuple(int(c) for c in RequestCode)
_ROLES = ("client", "admin")


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _hello(rng: random.Random) -> bytes:
    return encode_frame(_pack({"id": 1, "code": int(RequestCode.HELLO),
                               "body": hello_body(rng.choice(_ROLES))}),
                        compress_threshold=None)


def _request(rid: int, code: int, body: Any, compress: bool) -> bytes:
    payload = _pack({"id": rid, "code": code, "body": body})
    return encode_frame(payload, compress_threshold=1024 if compress else None)


def _code(rng: random.Random) -> int:
    if rng.random() < 0.9:
        return rng.choice(ALL_CODES)
    return rng.choice((0, 3, 99, 105, 211, 399, 400, 499, 2**31 - 1, rng.randint(0, 2**31 - 1)))


def random_bytes(rng: random.Random, ctx: Context) -> Plan:
    """Random bytes from the first byte, no HELLO."""
    return Plan([rng.randbytes(rng.choice((0, 1, 4, 5, 6, 64, 4096)))])


def random_after_hello(rng: random.Random, ctx: Context) -> Plan:
    """A valid HELLO, then random bytes."""
    return Plan([_hello(rng), rng.randbytes(rng.choice((1, 4, 5, 6, 64, 4096)))], requests=1)


def bad_header(rng: random.Random, ctx: Context) -> Plan:
    """Reserved flag bits, or a length beyond the frame limit (up to 2**32 - 1),
    with a few payload bytes after it."""
    if rng.random() < 0.5:
        flags = rng.choice((0x02, 0x80, 0xFF, 0x03)) | (rng.getrandbits(8) & 0xFE)
        length = rng.choice((0, 5, 100))
    else:
        flags = rng.choice((0, FLAG_ZSTD))
        length = rng.choice((ctx.max_frame_bytes + 1, 2**31, 2**32 - 1,
                             rng.randint(ctx.max_frame_bytes + 1, 2**32 - 1)))
    chunks = [HEADER.pack(length, flags) + rng.randbytes(rng.choice((0, 10, 1000)))]
    if rng.random() < 0.5:
        chunks.insert(0, _hello(rng))
    return Plan(chunks, requests=len(chunks))


def truncated(rng: random.Random, ctx: Context) -> Plan:
    """A valid request frame cut short (inside the header or the payload), then EOF."""
    frame = _request(2, _code(rng), body_for(_code(rng), rng, ctx.names), False)
    cut = rng.randint(1, len(frame) - 1)
    chunks = [frame[:cut]]
    if rng.random() < 0.7:
        chunks.insert(0, _hello(rng))
    return Plan(chunks, requests=len(chunks))


def bad_zstd(rng: random.Random, ctx: Context) -> Plan:
    """Frames flagged zstd: garbage, a zstd frame without its content size, one
    declaring more than the limit, or a valid one cut short."""
    roll = rng.random()
    inner = _pack({"id": 2, "code": int(RequestCode.PING), "body": random_value(rng)})
    if roll < 0.25:
        payload = rng.randbytes(rng.choice((0, 4, 20, 300)))
    elif roll < 0.5:
        payload = zstandard.ZstdCompressor(write_content_size=False).compress(inner)
    elif roll < 0.75:
        good = zstandard.ZstdCompressor(write_content_size=True).compress(inner)
        # The frame header's content size field, rewritten: this layout
        # (single segment, 4-byte size) is what the compressor picks for
        # payloads of 256 bytes to 64 KiB; for others the bytes are just garbage.
        patched = bytearray(good)
        if len(patched) > 9:
            struct.pack_into("<I", patched, 5, rng.choice((2**32 - 1, ctx.max_frame_bytes + 1)))
        payload = bytes(patched)
    else:
        good = zstandard.ZstdCompressor(write_content_size=True).compress(inner)
        payload = good[: rng.randint(0, len(good) - 1)]
    frame = HEADER.pack(len(payload), FLAG_ZSTD) + payload
    return Plan([_hello(rng), frame], requests=2)


def garbage_payload(rng: random.Random, ctx: Context) -> Plan:
    """Whole frames whose payload is not a request: random bytes, msgpack that is
    not a map, maps with missing or mistyped id/code, id 0 or beyond 2**63 - 1,
    deep nesting, trailing bytes."""
    roll = rng.random()
    if roll < 0.2:
        payload = rng.randbytes(rng.choice((0, 1, 7, 100)))
    elif roll < 0.35:
        payload = _pack(random_value(rng))
    elif roll < 0.5:
        # Nesting far deeper than msgpack's packer allows: hand-made arrays of one.
        depth = rng.choice((1000, 100_000, 1_000_000))
        payload = b"\x91" * depth + b"\xc0"
    elif roll < 0.65:
        payload = _pack({"id": rng.choice((0, -1, 2**63, 2**64 - 1, "1", None, True, 1.5)),
                         "code": int(RequestCode.PING), "body": None})
    elif roll < 0.8:
        payload = _pack({"id": 3, "code": rng.choice((-1, 2**31, 2**64 - 1, "200", None, 2.0)),
                         "body": None})
    elif roll < 0.9:
        payload = _pack({"id": 3, "code": int(RequestCode.PING), "body": 1}) + rng.randbytes(3)
    else:
        # A str/bin/array header claiming far more than the payload holds.
        payload = rng.choice((b"\xdb\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff",
                              b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff"))
    frame = encode_frame(payload, compress_threshold=None)
    chunks = [frame] if rng.random() < 0.3 else [_hello(rng), frame]
    return Plan(chunks, requests=len(chunks))


def bad_hello(rng: random.Random, ctx: Context) -> Plan:
    """A first request that is a HELLO with a broken body, or not a HELLO at all."""
    code = int(RequestCode.HELLO) if rng.random() < 0.7 else _code(rng)
    body = body_for(int(RequestCode.HELLO), rng, ctx.names)
    chunks = [_request(1, code, body, False)]
    if rng.random() < 0.5:
        chunks.append(_request(2, int(RequestCode.PING), None, False))
    return Plan(chunks, requests=len(chunks))


def requests(rng: random.Random, ctx: Context) -> Plan:
    """A valid HELLO, then 1-8 requests of random codes with structure-aware bodies
    (some compressed), sometimes one frame each with a pause, sometimes all in one write."""
    frames = [_hello(rng)]
    for rid in range(2, 2 + rng.randint(1, 8)):
        code = _code(rng)
        body = body_for(code, rng, ctx.names)
        try:
            frames.append(_request(rid, code, body, rng.random() < 0.2))
        except (ValueError, OverflowError, TypeError):
            # Not encodable (nesting past msgpack's own limit): send it deep anyway.
            frames.append(_request(rid, code, deep_nesting(rng, 400), False))
    if rng.random() < 0.5:
        return Plan([b"".join(frames)], requests=len(frames))
    return Plan(frames, requests=len(frames), pause_s=0.002)


def every_code(rng: random.Random, ctx: Context) -> Plan:
    """One request of every known code, each body built and broken once."""
    frames = [_hello(rng)]
    for rid, code in enumerate(ALL_CODES, start=2):
        body = body_for(code, rng, ctx.names)
        try:
            frames.append(_request(rid, code, body, False))
        except (ValueError, OverflowError, TypeError):
            frames.append(_request(rid, code, extreme_int(rng), False))
    return Plan([b"".join(frames)], requests=len(frames))
