"""scan_body (numpy columns) agrees with the record-by-record walk, on any
body, and its plain-Python path for small bodies with its numpy path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import Message, encode_messages, iter_records, tag_hash
from commitlog.columns import PYTHON_SCAN_MAX, RecordColumns, queue_groups, scan_body
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


def _same_columns(a: RecordColumns, b: RecordColumns) -> None:
    assert a.starts.tolist() == b.starts.tolist()
    assert a.heads.dtype == b.heads.dtype and a.heads.tolist() == b.heads.tolist()
    assert a.topics == b.topics
    assert a.topic_ids.tolist() == b.topic_ids.tolist()
    assert a.tag_hashes.dtype == b.tag_hashes.dtype
    assert a.tag_hashes.tolist() == b.tag_hashes.tolist()
    assert a.same_meta == b.same_meta
    for columns in (a, b):
        assert columns.rows is None or columns.rows == columns.heads.tolist()
    assert queue_groups(a) == queue_groups(b)


@st.composite
def small_or_damaged(draw: st.DrawFn) -> bytes:
    """Bodies of 1..PYTHON_SCAN_MAX + 2 records, often damaged: cut short,
    a byte of a head changed (sizes, lengths, flags), or a non-UTF-8 topic."""
    messages = draw(_messages)[: draw(st.integers(1, PYTHON_SCAN_MAX + 2))]
    if draw(st.booleans()):
        messages = [messages[0]] * len(messages)
    body = bytearray(encode_messages(messages, 1 << 20))
    damage = draw(st.sampled_from(["none", "none", "cut", "head", "topic"]))
    if damage == "cut":
        del body[draw(st.integers(0, len(body) - 1)):]
    elif damage == "head":
        at = draw(st.sampled_from(list(scan_body(bytes(body), 0).starts.tolist())))
        body[at + draw(st.integers(0, MESSAGE_HEAD_SIZE - 1))] = draw(st.integers(0, 255))
    elif damage == "topic":
        body[MESSAGE_HEAD_SIZE] = 0xFF
    return bytes(body)


@settings(max_examples=400, deadline=None)
@given(small_or_damaged())
def test_the_plain_python_scan_gives_the_numpy_scans_result(body: bytes) -> None:
    """Small bodies skip numpy; the columns (or the error) are the same."""
    try:
        numpy_scan = scan_body(body, python_max=0)
    except ValueError as exc:
        with pytest.raises(ValueError) as caught:
            scan_body(body)
        assert str(caught.value) == str(exc)
        return
    _same_columns(scan_body(body), numpy_scan)
    # A bytearray or memoryview takes the general path of the Python scan.
    _same_columns(scan_body(bytearray(body)), numpy_scan)
    _same_columns(scan_body(memoryview(body)), numpy_scan)


def test_a_one_record_scan_shares_nothing_writable_with_later_scans() -> None:
    body = encode_messages([Message("t", b"abc", tags="x")], 1 << 20)
    first, second = scan_body(body), scan_body(body)
    for array in (first.starts, first.heads, first.topic_ids, first.tag_hashes):
        with pytest.raises(ValueError):
            array[0] = 1  # read-only: a shared constant or a view of the body
    assert second.starts.tolist() == [0] and int(second.heads["size"][0]) == len(body)
