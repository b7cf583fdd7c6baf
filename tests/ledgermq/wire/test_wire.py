"""Unit and property tests of the pure wire codec, error mapping and stream helpers."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgermq.base import loop
from ledgermq.base.errors import (
    ErrorCode,
    FrameTooLargeError,
    InternalError,
    LedgerMQError,
    MalformedFrameError,
    NotLeaderError,
    UnknownTopicError,
    error_from_response,
    exception_class,
)
from ledgermq.wire import (
    FLAG_ZSTD,
    HEADER_SIZE,
    FrameDecoder,
    FrameWriter,
    Request,
    Response,
    decode_frame,
    decode_header,
    decode_payload,
    decode_request,
    decode_response,
    encode_frame,
    encode_frames,
    encode_request,
    encode_response,
    error_response,
    read_frame,
)
from ledgermq.wire.streams import WRITE_SLICE_FRAMES

# msgpack-representable bodies, as they come back (lists, not tuples).
bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
    | st.binary(max_size=200),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10) | st.integers(0, 1000), children, max_size=5),
    max_leaves=20,
)
ids = st.integers(min_value=0, max_value=2**63 - 1)
codes = st.integers(min_value=0, max_value=2**31 - 1)


# ------------------------------------------------------------------ messages


@given(st.integers(min_value=1, max_value=2**63 - 1), codes, bodies)
def test_request_round_trip(rid: int, code: int, body: object) -> None:
    req = Request(rid, code, body)
    assert decode_request(encode_request(req)) == req


@given(ids, codes, st.none() | st.text(max_size=80), bodies)
def test_response_round_trip(rid: int, status: int, error: str | None, body: object) -> None:
    resp = Response(rid, status, error, body)
    back = decode_response(encode_response(resp))
    assert back == resp
    assert back.ok == (status == 0)


@given(st.binary(max_size=300))
def test_decoding_arbitrary_bytes_only_raises_malformed(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        with contextlib.suppress(MalformedFrameError):
            decode(data)


@pytest.mark.parametrize(
    "obj",
    [
        [1, 2, 3],
        "text",
        {"code": 5},  # no id
        {"id": True, "code": 5},  # bool is not an id
        {"id": -1, "code": 5},
        {"id": 0, "code": 5},  # reserved for connection-level errors
        {"id": 2**64 - 1, "code": 5},  # beyond the signed 63-bit id space
        {"id": 1, "code": "5"},
        {"id": 1},
    ],
)
def test_request_of_wrong_shape_is_malformed(obj: object) -> None:
    with pytest.raises(MalformedFrameError):
        decode_request(msgpack.packb(obj))


def test_trailing_bytes_and_deep_nesting_are_malformed() -> None:
    good = encode_request(Request(1, 2, None))
    with pytest.raises(MalformedFrameError):
        decode_request(good + b"\x00")
    with pytest.raises(MalformedFrameError):
        decode_request(b"\x91" * 5000 + b"\x00")


def test_response_error_must_be_text() -> None:
    with pytest.raises(MalformedFrameError):
        decode_response(msgpack.packb({"id": 1, "status": 11, "error": 7}))


def test_unencodable_body_is_a_type_error_for_the_sender() -> None:
    with pytest.raises(TypeError):
        encode_request(Request(1, 2, object()))


# ------------------------------------------------------------------ frames


@given(st.binary(max_size=5000), st.none() | st.integers(0, 6000))
def test_frame_round_trip(payload: bytes, threshold: int | None) -> None:
    frame = encode_frame(payload, compress_threshold=threshold)
    got = decode_frame(frame)
    assert got == (payload, len(frame))
    # Any strict prefix is "not yet a whole frame", never an error.
    assert decode_frame(frame[: len(frame) - 1]) is None


def test_compression_applies_only_above_threshold_and_when_it_helps() -> None:
    text = b"ledgermq " * 2000
    small = encode_frame(text[:100], compress_threshold=1000)
    assert small[4] == 0 and len(small) == HEADER_SIZE + 100
    big = encode_frame(text, compress_threshold=1000)
    assert big[4] == FLAG_ZSTD and len(big) < len(text)
    assert decode_frame(big) == (text, len(big))
    noise = bytes(range(256)) * 4  # zstd cannot shrink this; stays raw
    raw = encode_frame(zstandard.ZstdCompressor().compress(noise), compress_threshold=1)
    assert raw[4] == 0
    assert encode_frame(text, compress_threshold=None)[4] == 0


@given(
    st.lists(st.binary(max_size=3000), max_size=8),
    st.lists(st.integers(1, 700), min_size=1, max_size=30),
)
def test_decoder_reassembles_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = encode_frames(payloads, compress_threshold=500)
    decoder = FrameDecoder()
    out: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        out += decoder.feed(stream[pos : pos + step])
        pos += step
        i += 1
    assert out == payloads
    assert decoder.buffered == 0


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_decoder_on_garbage_raises_only_frame_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    try:
        decoder.feed(data)
    except (MalformedFrameError, FrameTooLargeError) as exc:
        # Poisoned: the stream position is lost, so it keeps failing.
        with pytest.raises(type(exc)):
            decoder.feed(b"")


def test_oversized_header_is_refused_before_any_payload() -> None:
    header = struct.pack(">IB", 1001, 0)
    with pytest.raises(FrameTooLargeError) as info:
        decode_header(header, max_frame_bytes=1000)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(FrameTooLargeError):
        FrameDecoder(max_frame_bytes=1000).feed(header)  # no payload needed to decide
    assert decode_header(struct.pack(">IB", 1000, 0), max_frame_bytes=1000) == (1000, 0)


def test_unknown_flags_are_malformed() -> None:
    with pytest.raises(MalformedFrameError, match="flags"):
        decode_header(struct.pack(">IB", 1, 0x02))


def test_decompression_bomb_is_refused_by_declared_size() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * 100_000)
    assert len(bomb) < 1000
    with pytest.raises(FrameTooLargeError):
        decode_payload(FLAG_ZSTD, bomb, max_frame_bytes=50_000)
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100)
    with pytest.raises(MalformedFrameError, match="content size"):
        decode_payload(FLAG_ZSTD, undeclared)
    with pytest.raises(MalformedFrameError):
        decode_payload(FLAG_ZSTD, b"not zstd at all")
    corrupt = bytearray(zstandard.ZstdCompressor().compress(b"abc" * 1000))
    corrupt[-4:] = b"\xff\xff\xff\xff"
    with pytest.raises(MalformedFrameError):
        decode_payload(FLAG_ZSTD, bytes(corrupt))


# ------------------------------------------------------------------ errors


def test_every_error_code_has_its_own_exception_class() -> None:
    classes = {code: exception_class(code) for code in ErrorCode}
    assert len(set(classes.values())) == len(ErrorCode)
    for code, cls in classes.items():
        exc = error_from_response(code, "msg", None)
        assert type(exc) is cls and exc.code == code and exc.message == "msg"


def test_error_response_round_trip_keeps_type_and_details() -> None:
    resp = error_response(7, NotLeaderError("not me", leader="10.0.0.2:9000"))
    back = decode_response(encode_response(resp))
    exc = error_from_response(back.status, back.error, back.body)
    assert isinstance(exc, NotLeaderError) and exc.leader == "10.0.0.2:9000"
    resp = error_response(8, UnknownTopicError("no such topic"))
    assert resp.status == ErrorCode.UNKNOWN_TOPIC and resp.error == "no such topic"
    resp = error_response(9, KeyError("k"))
    assert resp.status == ErrorCode.INTERNAL and "KeyError" in (resp.error or "")
    assert isinstance(error_from_response(resp.status, resp.error), InternalError)


def test_unknown_status_from_a_newer_server_is_still_an_error() -> None:
    exc = error_from_response(999, None)
    assert type(exc) is LedgerMQError and exc.code == 999 and "ERROR_999" in str(exc)


# ------------------------------------------------------------------ streams


def _reader_with(data: bytes, eof: bool) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def test_read_frame_clean_eof_truncation_and_size_limit() -> None:
    async def main() -> None:
        frames = encode_frames([b"one", b"two" * 50_000], compress_threshold=1000)
        reader = _reader_with(frames, eof=True)
        assert await read_frame(reader) == b"one"
        assert await read_frame(reader) == b"two" * 50_000
        assert await read_frame(reader) is None  # EOF exactly between frames
        for cut in (2, HEADER_SIZE + 1):  # inside the header, inside the payload
            with pytest.raises(MalformedFrameError, match="closed inside"):
                await read_frame(_reader_with(frames[:cut], eof=True))
        # Only the header has arrived and the stream is still open: the limit is
        # enforced without waiting for the payload.
        with pytest.raises(FrameTooLargeError):
            await read_frame(_reader_with(struct.pack(">IB", 2000, 0), eof=False), 1000)

    loop.run(main())


async def _sink() -> tuple[asyncio.Server, asyncio.StreamWriter, bytearray, asyncio.Event]:
    """A loopback server that keeps every byte it reads (until EOF: the
    event), and a connection to it."""
    received = bytearray()
    got_eof = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            received.extend(chunk)
        got_eof.set()
        w.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, raw = await asyncio.open_connection("127.0.0.1", port)
    return server, raw, received, got_eof


def test_frame_writer_coalesces_frames_queued_in_one_loop_iteration() -> None:
    async def main() -> None:
        server, raw, received, got_eof = await _sink()
        writer = FrameWriter(raw)
        for i in range(10):
            writer.send(f"m{i}".encode())
        assert writer.writes == 0  # nothing written until the loop runs callbacks
        await asyncio.sleep(0)
        assert writer.frames == 10 and writer.writes == 1
        assert not writer.backlogged  # a reading peer: nothing piles up
        writer.send(b"last")
        await writer.close()  # close flushes what is queued
        assert writer.writes == 2 and writer.closing
        writer.send(b"dropped")  # after close: silently dropped
        await asyncio.sleep(0)
        assert writer.writes == 2 and writer.frames == 11
        async with asyncio.timeout(5):
            await got_eof.wait()
        assert FrameDecoder().feed(bytes(received)) == [
            *(f"m{i}".encode() for i in range(10)), b"last"]
        server.close()
        await server.wait_closed()

    loop.run(main())


def test_frame_writer_sends_a_large_burst_in_slices_in_order() -> None:
    """A pass that queues more than WRITE_SLICE_FRAMES frames writes a slice
    each time that many are queued and the rest at the end of the pass: the
    peer starts on the first answers of a window while the rest are encoded."""
    async def main() -> None:
        server, raw, received, got_eof = await _sink()
        writer = FrameWriter(raw)
        burst = 2 * WRITE_SLICE_FRAMES + 5
        for i in range(burst):
            writer.send(f"m{i}".encode())
            # A slice goes out at once when full, before the loop runs again.
            assert writer.writes == (i + 1) // WRITE_SLICE_FRAMES
        await asyncio.sleep(0)
        assert writer.writes == 3 and writer.frames == burst  # two slices and the rest
        await asyncio.sleep(0)
        assert writer.writes == 3  # the slices left no extra flush behind
        await writer.close()
        async with asyncio.timeout(5):
            await got_eof.wait()
        assert FrameDecoder().feed(bytes(received)) == [f"m{i}".encode() for i in range(burst)]
        server.close()
        await server.wait_closed()

    loop.run(main())


def test_frame_writer_is_backlogged_while_the_peer_does_not_read() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def on_connect(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await release.wait()  # reads nothing until told
            while await reader.read(1 << 20):
                pass
            w.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, raw = await asyncio.open_connection("127.0.0.1", port)
        writer = FrameWriter(raw, compress_threshold=None)
        payload = bytes(64 * 1024)
        sent = 0
        while not writer.backlogged:  # the kernel's buffers fill first
            writer.send(payload)
            writer.flush()
            sent += 1
            assert sent < 10_000, "never backlogged"
        release.set()
        async with asyncio.timeout(10):
            await writer.drain()
        assert not writer.backlogged
        await writer.close()
        server.close()
        await server.wait_closed()

    loop.run(main())


def test_loop_run_uses_uvloop_when_installed() -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    module = loop.run(which())
    assert module.startswith("uvloop") == loop.uvloop_available()
