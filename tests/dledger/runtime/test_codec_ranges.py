"""The peer codec's integer ranges: a term, index or position beyond 2**63 - 1
(or an entry kind beyond a byte) is refused at decode, so a peer frame cannot
plant a term the node would overflow when it next increments it (the wedge the
fuzzer reproduced: tests/chaos/fuzz/test_raft_port.py). A directory id is
checked the same way (it must fit `dledger.membership`'s 63-bit range)."""

from __future__ import annotations

import msgpack
import pytest

from dledger.messages import AppendRequest, AppendResponse, Heartbeat
from dledger.runtime.codec import MAX_TERM_OR_INDEX, CodecError, decode_batch

MAX = 1 << 20
HUGE = [2**63, 2**64 - 1]


# Each shape is a well-formed message (version 2 layout: type, src, dst, term,
# directory id, ...) with `v` in one field; a shape with v = 5 decodes.
SHAPES = [
    lambda v: [1, 1, 2, v, 0, 0, 0, False, False],       # VoteRequest term
    lambda v: [1, 1, 2, 3, v, 0, 0, False, False],       # VoteRequest directory id
    lambda v: [1, 1, 2, 3, 0, v, 0, False, False],       # VoteRequest last_index
    lambda v: [1, 1, 2, 3, 0, 0, v, False, False],       # VoteRequest last_term
    lambda v: [2, 1, 2, v, 0, True, False],              # VoteResponse term
    lambda v: [2, 1, 2, 3, v, True, False],              # VoteResponse directory id
    lambda v: [3, 1, 2, v, 0, 0],                        # Heartbeat term
    lambda v: [3, 1, 2, 3, v, 0],                        # Heartbeat directory id
    lambda v: [3, 1, 2, 3, 0, v],                        # Heartbeat commit
    lambda v: [4, 1, 2, v, 0],                           # HeartbeatResponse term
    lambda v: [4, 1, 2, 3, v],                           # HeartbeatResponse directory id
    lambda v: [4, 1, 2, 3, 0, v],                        # HeartbeatResponse last_index
    lambda v: [5, 1, 2, v, 0],                           # TimeoutNow term
    lambda v: [5, 1, 2, 3, v],                           # TimeoutNow directory id
    lambda v: [6, 1, 2, v, 0, 0, 0, 0, []],              # AppendRequest term
    lambda v: [6, 1, 2, 3, v, 0, 0, 0, []],              # directory id
    lambda v: [6, 1, 2, 3, 0, v, 0, 0, []],              # prev_index
    lambda v: [6, 1, 2, 3, 0, 0, v, 0, []],              # prev_term
    lambda v: [6, 1, 2, 3, 0, 0, 0, v, []],              # commit
    lambda v: [6, 1, 2, 3, 0, 0, 0, 0, [v, 1, 0, b""]],  # entry term
    lambda v: [6, 1, 2, 3, 0, 0, 0, 0, [1, 1, v, b""]],  # entry position
    lambda v: [7, 1, 2, v, 0, True, 0, 0, 0],            # AppendResponse term
    lambda v: [7, 1, 2, 3, v, True, 0, 0, 0],            # directory id
    lambda v: [7, 1, 2, 3, 0, True, v, 0, 0],            # index
    lambda v: [7, 1, 2, 3, 0, False, 0, v, 0],           # hint_index
    lambda v: [7, 1, 2, 3, 0, False, 0, 0, v],           # hint_term
    lambda v: [11, 1, 2, v, 0, 1, 1, 1, None],           # InstallSnapshot term
    lambda v: [11, 1, 2, 3, v, 1, 1, 1, None],           # directory id
    lambda v: [11, 1, 2, 3, 0, v, 1, 1, None],           # index
    lambda v: [11, 1, 2, 3, 0, 1, v, 1, None],           # snap_term
    lambda v: [11, 1, 2, 3, 0, 1, 1, v, None],           # end_position
    lambda v: [10, 1, 2, 3, v, 1, 1, 0, True, ""],       # SnapshotAck directory id
]


@pytest.mark.parametrize("value", [*HUGE, -1])
@pytest.mark.parametrize("shape", SHAPES)
def test_terms_indexes_and_directory_ids_beyond_i64_are_refused(shape, value: int) -> None:
    assert decode_batch(msgpack.packb(shape(5)), MAX)  # the shape itself is well formed
    with pytest.raises(CodecError):
        decode_batch(msgpack.packb(shape(value)), MAX)


def test_the_largest_accepted_term_still_decodes() -> None:
    got = decode_batch(msgpack.packb([3, 1, 2, MAX_TERM_OR_INDEX, MAX_TERM_OR_INDEX,
                                      MAX_TERM_OR_INDEX]), MAX)
    assert got == [Heartbeat(1, 2, MAX_TERM_OR_INDEX, MAX_TERM_OR_INDEX,
                             directory_id=MAX_TERM_OR_INDEX)]


def test_entries_may_not_run_past_the_largest_index() -> None:
    last = msgpack.packb([6, 1, 2, 3, 0, MAX_TERM_OR_INDEX - 1, 1, 0, [1, 1, 0, b""]])
    (msg,) = decode_batch(last, MAX)
    assert isinstance(msg, AppendRequest) and msg.entries[0].index == MAX_TERM_OR_INDEX
    with pytest.raises(CodecError):
        decode_batch(msgpack.packb([6, 1, 2, 3, 0, MAX_TERM_OR_INDEX, 1, 0, [1, 1, 0, b""]]),
                     MAX)


@pytest.mark.parametrize("kind", [256, 2**64 - 1, -1])
def test_entry_kind_must_fit_a_byte(kind: int) -> None:
    with pytest.raises(CodecError):
        decode_batch(msgpack.packb([6, 1, 2, 3, 0, 0, 0, 0, [1, kind, 0, b""]]), MAX)


def test_the_frequent_messages_take_node_ids_up_to_2_64_and_refuse_bools() -> None:
    # Appends and their answers check their integers in one pass and fall
    # back to the per-field checks when it fails: a node id above 2**63 is
    # still accepted there, a bool where an integer (or an int where a bool)
    # belongs is still refused.
    big = 2**64 - 1
    (req,) = decode_batch(msgpack.packb([6, big, 2, 3, 0, 0, 0, 0, [1, 1, 0, b"x"]]), MAX)
    assert isinstance(req, AppendRequest) and req.src == big and req.entries[0].data == b"x"
    (resp,) = decode_batch(msgpack.packb([7, 1, big, 3, 0, True, 4, 0, 0]), MAX)
    assert isinstance(resp, AppendResponse) and resp.dst == big and resp.index == 4
    for bad in ([6, 1, 2, True, 0, 0, 0, 0, []],            # AppendRequest term
                [6, 1, 2, 3, 0, 0, 0, 0, [1, True, 0, b""]],  # entry kind
                [6, 1, 2, 3, 0, 0, 0, 0, [1, 1, False, b""]],  # entry position
                [7, 1, 2, 3, 0, 1, 0, 0, 0],               # AppendResponse success
                [7, 1, 2, 3, 0, True, True, 0, 0]):        # AppendResponse index
        with pytest.raises(CodecError):
            decode_batch(msgpack.packb(bad), MAX)
