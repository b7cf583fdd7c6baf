"""scan_body (numpy columns) agrees with the record-by-record walk, on any body."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import Message, encode_messages, iter_records, tag_hash
from commitlog.columns import queue_groups, scan_body
from commitlog.message import MESSAGE_HEAD_SIZE

_messages = st.lists(st.builds(
    Message,
    topic=st.sampled_from(["t", "bench", "orders", "Ab_1"]),
    body=st.binary(max_size=40),
    queue_id=st.integers(0, 5),
    tags=st.sampled_from(["", "a", "TagB", "é"]),
    keys=st.sampled_from(["", "k1"]),
    born_host=st.just("h:1"),
    producer_id=st.integers(0, 3),
    sequence=st.integers(0, 2**40),
), min_size=1, max_size=40)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    messages = draw(_messages)
    if draw(st.booleans()):  # uniform records: the numpy fast path
        messages = [messages[0]] * len(messages)
    return encode_messages(messages, 1 << 20)


@st.composite
def large_bodies(draw: st.DrawFn) -> bytes:
    """More records than queue_groups groups in Python (its numpy path)."""
    messages = draw(_messages)
    queues = draw(st.lists(st.integers(0, 5), min_size=129, max_size=300))
    picked = [messages[i % len(messages)] for i in range(len(queues))]
    return encode_messages([Message(m.topic, m.body, queue_id=q, tags=m.tags)
                            for m, q in zip(picked, queues, strict=True)], 1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(bodies(), large_bodies()))
def test_columns_equal_the_record_walk(body: bytes) -> None:
    columns = scan_body(body)
    walked = list(iter_records(body))
    assert columns.starts.tolist() == [offset for offset, _ in walked]
    for k, (offset, fields) in enumerate(walked):
        assert tuple(int(x) for x in columns.heads[k].tolist()) == fields
        p = offset + MESSAGE_HEAD_SIZE
        assert columns.topics[int(columns.topic_ids[k])] == body[p : p + fields[9]].decode()
        tags = body[p + fields[9] : p + fields[9] + fields[10]]
        assert int(columns.tag_hashes[k]) == tag_hash(tags)
    # Queue groups: every record once, in body order within a queue, and the
    # queues in order of first appearance.
    seen: list[int] = []
    firsts = []
    for (topic, queue_id), members in queue_groups(columns):
        numbers = list(range(len(walked))) if members is None else list(members)
        assert numbers == sorted(numbers)
        firsts.append(numbers[0])
        for k in numbers:
            offset, fields = walked[k]
            assert fields[1] == queue_id
            assert columns.topics[int(columns.topic_ids[k])] == topic
        seen += numbers
    assert sorted(seen) == list(range(len(walked))) and firsts == sorted(firsts)


@pytest.mark.parametrize("cut", [1, 30, 67, 69])
def test_malformed_bodies_are_refused_like_the_walk(cut: int) -> None:
    body = encode_messages([Message("t", b"x" * 10), Message("t", b"y" * 10)], 1 << 20)
    bad = body[:-cut]
    with pytest.raises(ValueError):
        list(iter_records(bad))
    with pytest.raises(ValueError):
        scan_body(bad)


def test_a_size_that_disagrees_with_the_field_lengths_is_refused() -> None:
    body = bytearray(encode_messages([Message("t", b"abc")] * 3, 1 << 20))
    body[MESSAGE_HEAD_SIZE - 1] ^= 1  # body length of the first record
    with pytest.raises(ValueError, match="inconsistent"):
        scan_body(bytes(body))


def test_empty_body_has_no_records() -> None:
    columns = scan_body(b"")
    assert len(columns) == 0 and queue_groups(columns) == []
