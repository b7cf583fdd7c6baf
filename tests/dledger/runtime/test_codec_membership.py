"""Peer protocol version 2: every message carries its sender's directory id,
InstallSnapshot carries the configuration, CONFIG entries travel like any
entry; a forged or broken configuration, an out-of-range directory id and a
version 1 peer are refused with a clear CodecError."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import Entry, EntryKind
from dledger.membership import Member, Membership, bootstrap, encode
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.runtime.codec import (
    HELLO_MAGIC,
    HELLO_VERSION,
    MAX_TERM_OR_INDEX,
    MEMBERSHIP_BYTES_MAX,
    CodecError,
    PeerVersionError,
    decode_batch,
    decode_hello,
    encode_batches,
    encode_hello,
    encode_message,
)
from dledger.runtime.snapshot_transfer import SnapshotAck, SnapshotChunk, SnapshotOffer

MAX = 1 << 22
CONFIG = bootstrap({1: "10.0.0.1:7001", 2: "10.0.0.2:7001", 3: "10.0.0.3:7001"})

u63 = st.integers(0, MAX_TERM_OR_INDEX)
small = st.integers(0, 1 << 40)
node = st.integers(1, 1 << 20)


@st.composite
def memberships(draw: st.DrawFn) -> Membership:
    ids = draw(st.lists(st.integers(1, MAX_TERM_OR_INDEX), min_size=1, max_size=7,
                        unique=True))
    cut = draw(st.integers(1, len(ids)))
    members = [Member(i, draw(st.text(max_size=40)), draw(u63)) for i in ids]
    return Membership(tuple(sorted(members[:cut], key=lambda m: m.node_id)),
                      tuple(sorted(members[cut:], key=lambda m: m.node_id)))


@st.composite
def entries(draw: st.DrawFn, prev_index: int) -> tuple[Entry, ...]:
    out = []
    for k in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(list(EntryKind)))
        data = encode(draw(memberships())) if kind == EntryKind.CONFIG else draw(
            st.binary(max_size=64))
        out.append(Entry(prev_index + 1 + k, draw(small), int(kind), data, draw(small)))
    return tuple(out)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    src, dst, term, d = draw(node), draw(node), draw(u63), draw(u63)
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return VoteRequest(src, dst, term, draw(u63), draw(u63), draw(st.booleans()),
                           draw(st.booleans()), directory_id=d)
    if kind == 1:
        return VoteResponse(src, dst, term, draw(st.booleans()), draw(st.booleans()),
                            directory_id=d)
    if kind == 2:
        return Heartbeat(src, dst, term, draw(u63), directory_id=d)
    if kind == 3:
        return HeartbeatResponse(src, dst, term, draw(st.one_of(st.just(-1), u63)),
                                 directory_id=d)
    if kind == 4:
        return TimeoutNow(src, dst, term, directory_id=d)
    if kind == 5:
        prev = draw(small)
        return AppendRequest(src, dst, term, prev, draw(small), draw(entries(prev)),
                             draw(u63), directory_id=d)
    if kind == 6:
        return AppendResponse(src, dst, term, draw(st.booleans()), draw(u63), draw(u63),
                              draw(u63), directory_id=d)
    if kind == 7:
        return InstallSnapshot(src, dst, term, draw(u63), draw(u63), draw(u63),
                               draw(st.none() | memberships()), directory_id=d)
    if kind == 8:
        return SnapshotOffer(src, dst, term, draw(small), draw(u63), draw(u63), draw(u63),
                             draw(u63), draw(st.integers(0, 2**32 - 1)),
                             (("state", draw(small)),), directory_id=d)
    if kind == 9:
        from crc32c import crc32c

        data = draw(st.binary(min_size=1, max_size=64))
        return SnapshotChunk(src, dst, term, draw(small), draw(u63), "state", draw(small),
                             data, crc32c(data), draw(st.booleans()), directory_id=d)
    ok = draw(st.booleans())
    return SnapshotAck(src, dst, term, draw(small), draw(u63), draw(u63), ok,
                       "" if ok else draw(st.text(max_size=50)), directory_id=d)


@settings(max_examples=400, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=8))
def test_every_message_round_trips_with_its_directory_id(batch: list[Message]) -> None:
    payloads = encode_batches(batch, 1 << 20)
    assert [m for p in payloads for m in decode_batch(p, MAX)] == batch


@settings(max_examples=100, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=4), u63)
def test_a_transport_sends_every_message_under_its_own_directory_id(
        batch: list[Message], d: int) -> None:
    got = [m for p in encode_batches(batch, 1 << 20, directory_id=d)
           for m in decode_batch(p, MAX)]
    assert [m.directory_id for m in got] == [d] * len(batch)


def test_install_snapshot_carries_the_membership_or_none() -> None:
    for membership in (None, CONFIG):
        msg = InstallSnapshot(1, 2, 9, 100, 8, 4096, membership, directory_id=77)
        assert decode_batch(encode_message(msg), MAX) == [msg]
    raw = msgpack.unpackb(encode_message(InstallSnapshot(1, 2, 9, 100, 8, 4096, CONFIG)))
    assert raw[8] == encode(CONFIG)  # the CONFIG entry's bytes, as stored in the log


def _install(membership: object) -> bytes:
    return msgpack.packb([11, 1, 2, 9, 0, 100, 8, 4096, membership], use_bin_type=True)


def _member(node_id: object = 1, address: object = "h:1", directory_id: object = 0) -> dict:
    return {"node_id": node_id, "address": address, "directory_id": directory_id}


def _json(voters: list, learners: list | None = None, v: object = 1) -> bytes:
    return json.dumps({"v": v, "voters": voters, "learners": learners or []}).encode()


BAD_MEMBERSHIPS = [
    pytest.param("a string", id="not binary"),
    pytest.param(7, id="an integer"),
    pytest.param(b"", id="empty"),
    pytest.param(b"not json", id="not json"),
    pytest.param(b"\xff\xfe\x00", id="not utf-8"),
    pytest.param(b"[" * 200_000, id="nested deeper than the parser"),
    pytest.param(b"{" + b" " * MEMBERSHIP_BYTES_MAX + b"}", id="too large"),
    pytest.param(_json([], v=2), id="unknown version"),
    pytest.param(_json([]), id="no voter"),
    pytest.param(b'{"v":1,"voters":"abc","learners":[]}', id="voters a string"),
    pytest.param(b'{"v":1,"learners":[]}', id="voters missing"),
    pytest.param(_json([_member(node_id=0)]), id="node id 0"),
    pytest.param(_json([_member(node_id=-5)]), id="negative node id"),
    pytest.param(_json([_member(node_id=2**63)]), id="huge node id"),
    pytest.param(_json([_member(directory_id=2**63)]), id="huge directory id"),
    pytest.param(_json([_member(directory_id=-1)]), id="negative directory id"),
    pytest.param(b'{"v":1,"voters":[{"node_id":1,"address":"h","directory_id":'
                 + b"9" * 5000 + b"}],\"learners\":[]}", id="a 5000-digit number"),
    pytest.param(_json([_member(node_id=True)]), id="bool node id"),
    pytest.param(_json([_member(node_id=1.0)]), id="float node id"),
    pytest.param(_json([_member(address=5)]), id="address not a string"),
    pytest.param(_json([_member(address="x" * 300)]), id="address too long"),
    pytest.param(_json([_member(1)], [_member(1)]), id="a node twice"),
    pytest.param(_json([_member(2), _member(1)]), id="unsorted"),
    pytest.param(_json([["not", "an", "object"]]), id="member not an object"),
    pytest.param(json.dumps([1, 2]).encode(), id="not an object"),
]


@pytest.mark.parametrize("membership", BAD_MEMBERSHIPS)
def test_a_malformed_snapshot_membership_is_refused(membership: object) -> None:
    with pytest.raises(CodecError, match="InstallSnapshot membership"):
        decode_batch(_install(membership), MAX)


@pytest.mark.parametrize("membership", [m for m in BAD_MEMBERSHIPS
                                        if isinstance(m.values[0], bytes)])
def test_a_config_entry_that_is_no_configuration_is_refused(membership: object) -> None:
    append = msgpack.packb([6, 1, 2, 3, 0, 9, 2, 0, [2, 2, 4096, b"", 2, 4, 4144, membership]],
                           use_bin_type=True)
    with pytest.raises(CodecError, match="CONFIG entry 11"):
        decode_batch(append, MAX)


def test_config_entries_pass_through_and_other_kinds_stay_opaque() -> None:
    msg = AppendRequest(1, 2, 3, 9, 2, (
        Entry(10, 3, EntryKind.NOOP, b"", 4096),
        Entry(11, 3, EntryKind.CONFIG, encode(CONFIG), 4144),
        Entry(12, 3, EntryKind.MESSAGES, b"{not json", 5000),
    ), 10, directory_id=5)
    assert decode_batch(encode_message(msg), MAX) == [msg]


def test_a_hello_of_another_version_is_refused_clearly() -> None:
    assert HELLO_VERSION == 2
    assert decode_hello(encode_hello("g1", 1, 2, "control"))["version"] == 2
    v1 = msgpack.packb({"hello": HELLO_MAGIC, "version": 1, "group": "g1", "src": 4, "dst": 2,
                        "channel": "control"})
    with pytest.raises(PeerVersionError) as caught:
        decode_hello(v1)
    err = caught.value
    assert (err.version, err.src) == (1, 4)
    assert "node 4 speaks Raft peer protocol version 1, this node speaks 2" in str(err)
    assert "same LedgerMQ release" in str(err)
    for version in ("2", None, 3, True):
        hello = msgpack.packb({"hello": HELLO_MAGIC, "version": version, "group": "g1",
                               "src": "x", "dst": 2, "channel": "control"})
        with pytest.raises(PeerVersionError, match="the peer speaks"):
            decode_hello(hello)
