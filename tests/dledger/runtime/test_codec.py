"""The peer codec: exact round trips, and every malformed input is a CodecError (never a crash)."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import Entry
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.runtime.codec import (
    CodecError,
    decode_batch,
    decode_hello,
    encode_batches,
    encode_hello,
    encode_message,
)

MAX = 1 << 20

SAMPLES = [
    VoteRequest(1, 2, 7, 100, 6, pre_vote=True, transfer=False, directory_id=2**63 - 1),
    VoteRequest(1, 3, 8, 100, 6, pre_vote=False, transfer=True),
    VoteResponse(2, 1, 7, True, pre_vote=True),
    Heartbeat(1, 2, 7, 99),
    HeartbeatResponse(2, 1, 7),
    HeartbeatResponse(3, 1, 7, 14),  # a follower that lost its tail says where it ends
    TimeoutNow(1, 2, 7),
    AppendRequest(1, 2, 7, 10, 6, (), 9),
    AppendRequest(1, 2, 7, 10, 6, (Entry(11, 7, 2, b"", 4096), Entry(12, 7, 1, b"\x00" * 70,
                                                                          4144)), 11),
    AppendResponse(2, 1, 7, False, 10, 4, 5),
    AppendResponse(2, 1, 7, True, 12, directory_id=12345),
]


def test_round_trip_all_types() -> None:
    payloads = encode_batches(SAMPLES, 1 << 20)
    assert len(payloads) == 1
    assert decode_batch(payloads[0], MAX) == SAMPLES


def test_batches_are_cut_by_size() -> None:
    msgs = [AppendRequest(1, 2, 1, i, 1, (Entry(i + 1, 1, 1, b"x" * 1000, i * 1048),), i)
            for i in range(50)]
    payloads = encode_batches(msgs, 10_000)
    assert len(payloads) > 1 and all(len(p) < 12_000 for p in payloads)
    assert [m for p in payloads for m in decode_batch(p, MAX)] == msgs


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", b"\x90", b"\x91\x63", b"\x93\x01\x02\x03",
    msgpack.packb([3, 1, 2, 3, 0, True]), msgpack.packb([3, 1, 2, -3, 0, 4]),
    msgpack.packb([3, 1, 2, 3, True, 4]), msgpack.packb([6, 1, 2, 3, 0, 4, 5, 6, [1, 1, 1]]),
    msgpack.packb([6, 1, 2, 3, 0, 4, 5, 6, [1, 1, 1, "text"]]), msgpack.packb({"a": 1}),
    msgpack.packb([2, 1, 2, 3, 0, 1, 0]), msgpack.packb([99, 1, 2, 3, 0]),
    # The version 1 layout (no directory id) is refused too.
    msgpack.packb([3, 1, 2, 3, 4]), msgpack.packb([5, 1, 2, 3]),
])
def test_malformed_batches_rejected(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode_batch(payload, MAX)


def test_a_batch_whose_last_message_is_cut_short_is_rejected() -> None:
    """A frame holds whole messages: its bytes cut inside a message after
    one or more whole ones are refused, not decoded up to the cut (an
    Unpacker stops there as if waiting for more bytes)."""
    ack = encode_message(AppendResponse(2, 1, 3, True, 11, directory_id=5))
    append = encode_message(AppendRequest(1, 2, 3, 10, 3, (Entry(11, 3, 1, b"x" * 100, 0),),
                                          9, directory_id=7))
    assert len(decode_batch(ack + append + ack, MAX)) == 3
    for cut in (ack + append[:-2], ack + ack[:3], ack + ack + append[:1]):
        with pytest.raises(CodecError, match="ends inside a message"):
            decode_batch(cut, MAX)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_never_crashes(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_batch(data, MAX)


def test_hello() -> None:
    hello = decode_hello(encode_hello("g1", 1, 2, "control"))
    assert (hello["group"], hello["src"], hello["dst"], hello["channel"]) == ("g1", 1, 2,
                                                                                "control")
    for bad in (b"\xc1", msgpack.packb({"hello": "x"}), msgpack.packb([1, 2]),
                encode_hello("g1", 1, 2, "bulk")):
        with pytest.raises(CodecError):
            decode_hello(bad)


def test_authenticating_handshake_frames() -> None:
    from dledger.runtime.codec import (
        decode_challenge,
        decode_proof,
        encode_challenge,
        encode_proof,
        peer_claim,
    )

    nonce, challenge, proof = b"n" * 16, b"c" * 16, b"p" * 32
    hello = decode_hello(encode_hello("g1", 1, 2, "replication", nonce))
    assert hello["nonce"] == nonce
    assert "nonce" not in decode_hello(encode_hello("g1", 1, 2, "control"))
    assert decode_challenge(encode_challenge(challenge, proof)) == (challenge, proof)
    assert decode_proof(encode_proof(proof)) == proof
    # Each claim is distinct: group, direction and channel all bind.
    claims = {peer_claim("g1", 1, 2, "control"), peer_claim("g1", 2, 1, "control"),
              peer_claim("g2", 1, 2, "control"), peer_claim("g1", 1, 2, "replication")}
    assert len(claims) == 4
    for bad in (encode_hello("g1", 1, 2, "control", b"short"),
                encode_hello("g1", 1, 2, "control", b"x" * 33)):
        with pytest.raises(CodecError):
            decode_hello(bad)
    for bad in (encode_challenge(b"c" * 15, proof), encode_challenge(challenge, b"p" * 31),
                msgpack.packb({"challenge": "text", "proof": proof}), msgpack.packb([1])):
        with pytest.raises(CodecError):
            decode_challenge(bad)
    for bad in (encode_proof(b"p" * 16), msgpack.packb({"proof": 1}), b"\xc1"):
        with pytest.raises(CodecError):
            decode_proof(bad)
