"""BrokerState snapshots, topic deletion and the agreed retention point.

The property: for any sequence of committed entries and any split point,
replaying the whole sequence gives the same state as restoring a snapshot
taken at the split and replaying only the rest — which is what a broker's
start-up and a follower's snapshot install rely on.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog import (
    HEADER_SIZE,
    KIND_CONTROL,
    KIND_MESSAGES,
    KIND_NOOP,
    Entry,
    Message,
    encode_messages,
)
from ledgermq.broker.control import (
    acl_grant,
    acl_user_delete,
    acl_user_put,
    encode_control,
    log_trim,
    offsets_commit,
    offsets_reset,
    topic_delete,
    topic_put,
)
from ledgermq.broker.state import BrokerState, SnapshotFormatError

TOPICS = ["a", "b", "c"]
SECRET = b"s" * 32

messages_body = st.lists(
    st.tuples(st.sampled_from(TOPICS), st.integers(0, 3), st.integers(0, 3),
              st.integers(0, 40)),
    min_size=1, max_size=12,
).map(lambda ms: ("messages", [Message(t, b"x" * (q + 1), queue_id=q, producer_id=p,
                                       sequence=s if p else 0) for t, q, p, s in ms]))
offsets = st.lists(st.tuples(st.sampled_from(["g1", "g2"]), st.sampled_from(TOPICS),
                             st.integers(0, 3), st.integers(0, 50)), min_size=1, max_size=4)
control_op = st.one_of(
    st.builds(topic_put, st.sampled_from(TOPICS), st.integers(1, 4)),
    st.builds(topic_delete, st.sampled_from(TOPICS)),
    st.builds(offsets_commit, offsets),
    st.builds(offsets_reset, offsets),
    st.builds(log_trim, st.integers(0, 1 << 30)),
    st.just({"op": "log.trim", "position": -5}),
    st.builds(lambda k: acl_user_put({"access_key": k, "secret": SECRET, "topics": {"a": "PUB"}}),
              st.sampled_from(["u1", "u2"])),
    st.builds(lambda k: acl_grant(k, {"b": "SUB"}, {"g1": "SUB"}), st.sampled_from(["u1", "u2"])),
    st.builds(acl_user_delete, st.sampled_from(["u1", "u2"])),
)
controls_body = st.lists(control_op, min_size=1, max_size=3).map(lambda ops: ("control", ops))
entry_spec = st.one_of(messages_body, controls_body, st.just(("noop", None)),
                       st.just(("garbage", None)))


def build_entries(specs: list[tuple[str, object]]) -> list[Entry]:
    entries, position = [], 0
    for index, (kind, payload) in enumerate(specs, start=1):
        if kind == "messages":
            entry = Entry(index, 1, KIND_MESSAGES, position,
                          encode_messages(payload, 1 << 20))  # type: ignore[arg-type]
        elif kind == "control":
            entry = Entry(index, 1, KIND_CONTROL, position,
                          encode_control(payload))  # type: ignore[arg-type]
        elif kind == "garbage":
            entry = Entry(index, 1, KIND_CONTROL, position, b"\xc1 not msgpack")
        else:
            entry = Entry(index, 1, KIND_NOOP, position, b"")
        entries.append(entry)
        position += HEADER_SIZE + len(entry.body)
    return entries


def observable(state: BrokerState) -> dict[str, object]:
    """What clients and replicas see of a state, through its public reads."""
    lookups = {(p, s): state.producers.lookup(p, s) for p in range(1, 4) for s in range(-1, 42)}
    return {
        "applied": state.applied_index, "topics": dict(state.topics),
        "topics_version": state.topics_version, "offsets": dict(state.offsets),
        "queue_next": dict(state.queue_next), "deleted_before": dict(state.deleted_before),
        "trim": state.trim, "bad": (state.bad_control_entries, state.bad_acl_ops),
        "users": {k: u.to_record() for k, u in state.acl.users.items()},
        "highs": [state.producers.high(p) for p in range(1, 4)], "lookups": lookups,
        "producers": len(state.producers),
    }


def replay(state: BrokerState, entries: list[Entry]) -> BrokerState:
    for entry in entries:
        state.apply(entry)
    return state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(entry_spec, min_size=1, max_size=30), data=st.data())
def test_snapshot_then_replay_of_the_rest_equals_replay_of_everything(specs, data) -> None:
    entries = build_entries(specs)
    split = data.draw(st.integers(0, len(entries)))
    # A small dedup window and few producers: eviction is part of the state.
    whole = replay(BrokerState(dedup_window=6, dedup_producers_max=2), entries)
    head = replay(BrokerState(dedup_window=6, dedup_producers_max=2), entries[:split])
    restored = BrokerState.from_snapshot(head.to_snapshot(), dedup_window=6,
                                         dedup_producers_max=2)
    assert observable(restored) == observable(head)
    replay(restored, entries[split:])
    assert observable(restored) == observable(whole)
    # The encoding is canonical: same state, same bytes.
    assert restored.to_snapshot() == whole.to_snapshot()


def test_a_capture_is_not_changed_by_later_applies() -> None:
    entries = build_entries([
        ("control", [topic_put("a", 2)]),
        ("messages", [Message("a", b"m", queue_id=0, producer_id=1, sequence=s)
                      for s in range(3)]),
        ("control", [offsets_commit([("g1", "a", 0, 2)])]),
        ("messages", [Message("a", b"n", queue_id=0, producer_id=1, sequence=3)]),
        ("control", [topic_delete("a"), log_trim(4096)]),
    ])
    state = replay(BrokerState(), entries[:3])
    capture = state.capture()
    expected = state.to_snapshot()
    replay(state, entries[3:])
    assert capture.encode() == expected
    restored = BrokerState.from_snapshot(expected)
    assert restored.applied_index == 3 and restored.offset_of("g1", "a", 0) == 2
    assert restored.producers.lookup(1, 2)[1].queue_offset == 2  # type: ignore[union-attr]


def test_from_snapshot_refuses_what_it_cannot_read() -> None:
    good = BrokerState().to_snapshot()
    doc = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(good), raw=False)
    cctx = zstandard.ZstdCompressor(write_content_size=True)

    def packed(d: object) -> bytes:
        return cctx.compress(msgpack.packb(d, use_bin_type=True))

    with pytest.raises(SnapshotFormatError, match="not a broker state snapshot"):
        BrokerState.from_snapshot(b"garbage")
    with pytest.raises(SnapshotFormatError, match="version 2"):
        BrokerState.from_snapshot(packed({**doc, "v": 2}))
    with pytest.raises(SnapshotFormatError, match="no format marker"):
        BrokerState.from_snapshot(packed({**doc, "format": "other"}))
    with pytest.raises(SnapshotFormatError, match="malformed"):
        BrokerState.from_snapshot(packed({k: v for k, v in doc.items() if k != "topics"}))
    with pytest.raises(SnapshotFormatError, match="malformed"):
        BrokerState.from_snapshot(packed({**doc, "acl_users": [{"access_key": "u"}]}))



def test_a_snapshot_whose_producer_columns_disagree_is_refused() -> None:
    """A producer's window is restored as columns read lazily: a topic number
    outside the names, or columns of another length than the sequences, is
    refused at restore, not found at some later lookup."""
    state = BrokerState()
    body = encode_messages([Message(topic="t", body=b"x", producer_id=7, sequence=s)
                            for s in (1, 2, 3)], 1 << 20)
    state.apply(Entry(1, 1, KIND_MESSAGES, 0, body))
    doc = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(state.to_snapshot()),
                          raw=False)
    cctx = zstandard.ZstdCompressor(write_content_size=True)

    def with_producer(**columns: bytes) -> bytes:
        pid, high, seqs, phys, tids, qids, qoffs = doc["producers"][0]
        fields = {"seqs": seqs, "phys": phys, "tids": tids, "qids": qids, "qoffs": qoffs,
                  **columns}
        producer = [pid, high, *fields.values()]
        return cctx.compress(msgpack.packb({**doc, "producers": [producer]}, use_bin_type=True))

    assert BrokerState.from_snapshot(with_producer()).producers.lookup(7, 2)[1] is not None
    with pytest.raises(SnapshotFormatError, match="topic number outside"):
        BrokerState.from_snapshot(with_producer(tids=np.array([0, 1, 0], "<i4").tobytes()))
    with pytest.raises(SnapshotFormatError, match="topic number outside"):
        BrokerState.from_snapshot(with_producer(tids=np.array([0, -1, 0], "<i4").tobytes()))
    with pytest.raises(SnapshotFormatError, match="columns of other lengths"):
        BrokerState.from_snapshot(with_producer(qoffs=np.array([0, 1], "<i8").tobytes()))
    with pytest.raises(SnapshotFormatError, match="malformed"):
        BrokerState.from_snapshot(with_producer(phys=b"\x00" * 7))


def test_topic_delete_forgets_the_topic_and_marks_its_messages_dead() -> None:
    entries = build_entries([
        ("control", [topic_put("a", 2), topic_put("b", 1)]),
        ("messages", [Message("a", b"m", queue_id=q) for q in (0, 1, 1)]
         + [Message("b", b"m", queue_id=0)]),
        ("control", [offsets_commit([("g1", "a", 1, 2), ("g1", "b", 0, 1)])]),
        ("control", [topic_delete("a")]),
        ("messages", [Message("a", b"new", queue_id=1)]),
    ])
    state = replay(BrokerState(), entries[:3])
    version = state.topics_version
    state.apply(entries[3])
    assert "a" not in state.topics and state.topics_version == version + 1
    assert state.queue_next == {("b", 0): 1}
    assert state.offsets == {("g1", "b", 0): 1}
    assert state.offset_of("g1", "a", 1) == -1
    assert state.deleted_before == {"a": 4}
    assert state.take_deleted() == ["a"] and state.take_deleted() == []
    # A message sent to the name again counts from queue offset 0.
    stored = state.apply(entries[4])
    assert [s.queue_offset for s in stored] == [0]
    # Deleting a name that is not a topic still marks earlier messages dead
    # (messages can reach the log for a topic deleted meanwhile).
    state.apply(build_entries([("noop", None)] * 5 + [("control", [topic_delete("a")])])[5])
    assert state.deleted_before["a"] == 6 and state.queue_next == {("b", 0): 1}


def test_log_trim_only_moves_forward_and_skips_invalid_positions() -> None:
    ops = [log_trim(8192), log_trim(4096), {"op": "log.trim", "position": "far"},
           {"op": "log.trim", "position": True}, {"op": "log.trim"},
           {"op": "log.trim", "position": -1}]
    state = BrokerState()
    for entry in build_entries([("control", [op]) for op in ops]):
        state.apply(entry)
        assert state.trim == 8192
    state.apply(build_entries([("noop", None)] * 6 + [("control", [log_trim(1 << 40)])])[6])
    assert state.trim == 1 << 40
