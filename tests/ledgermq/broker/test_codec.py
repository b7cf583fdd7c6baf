"""scan_records: the whole-blob (numpy) check, its plain-Python form for a few
records and the record-by-record one agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import Message, encode_messages
from commitlog.columns import PYTHON_SCAN_MAX
from ledgermq.base.errors import InvalidRequestError, MessageTooLargeError
from ledgermq.broker.codec import _scan_columns, _scan_one_by_one, scan_records

_records = st.lists(st.builds(
    Message,
    topic=st.sampled_from(["t", "bench", "A_b-1"]),
    body=st.binary(max_size=30),
    queue_id=st.integers(0, 3),
    tags=st.sampled_from(["", "x", "é", "TagA"]),
    keys=st.sampled_from(["", "k"]),
    born_host=st.sampled_from(["h:1", "höst:1"]),
    producer_id=st.integers(0, 2),
    sequence=st.integers(0, 100),
), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(_records, st.booleans())
def test_fast_and_slow_scans_give_the_same_answer(messages: list[Message], uniform: bool) -> None:
    if uniform:
        messages = [messages[0]] * len(messages)
    blob = encode_messages(messages, 1 << 20)
    slow = _scan_one_by_one(blob, 1 << 20)
    assert scan_records(blob, 1 << 20)[:4] == slow[:4]  # all but the columns it kept
    fast = _scan_columns(blob, 1 << 20)
    fast = fast if fast is None else fast._replace(columns=None)
    if uniform or all(m.tags.isascii() and m.born_host.isascii() for m in messages):
        assert fast == slow  # the fast path decides these itself
    else:
        assert fast in (None, slow)  # mixed non-ASCII texts go record by record


def test_non_ascii_utf8_texts_are_accepted_and_invalid_utf8_refused() -> None:
    good = encode_messages([Message("t", b"a", tags="é"), Message("t", b"b", keys="ключ")],
                           1 << 20)
    assert len(scan_records(good, 1 << 20).starts) == 2
    bad = bytearray(encode_messages([Message("t", b"a", tags="ab")], 1 << 20))
    bad[68 + 1] = 0xFF  # first tag byte (after the 1-byte topic)
    with pytest.raises(InvalidRequestError, match="UTF-8"):
        scan_records(bytes(bad), 1 << 20)


@st.composite
def _small_blobs(draw: st.DrawFn) -> bytes:
    """A few records (the plain-Python check), sometimes with a system flag
    set, a record over the size limit, or a non-ASCII or invalid text."""
    messages = draw(_records)[: draw(st.integers(1, PYTHON_SCAN_MAX + 2))]
    if draw(st.booleans()):
        messages = [messages[0]] * len(messages)
    blob = bytearray(encode_messages(messages, 1 << 20))
    damage = draw(st.sampled_from(["none", "none", "sys_flag", "bad_text", "topic"]))
    if damage == "sys_flag":
        blob[12] = draw(st.integers(1, 255))  # first record's sys flag
    elif damage == "bad_text":
        blob[-1 - len(messages[-1].body)] = 0xFF  # last byte of the last record's texts
    elif damage == "topic":
        blob[68] = ord("#")  # not a valid topic character
    return bytes(blob)


@settings(max_examples=300, deadline=None)
@given(_small_blobs(), st.sampled_from([1 << 20, 100, 140]))
def test_plain_python_and_numpy_checks_give_the_same_answer(blob: bytes, size_max: int) -> None:
    """A blob of a few records skips numpy; the result (or the error) is the same."""
    fast = _scan_columns(blob, size_max)
    numpy_check = _scan_columns(blob, size_max, python_max=0)
    if numpy_check is None:
        assert fast is None
    else:
        assert fast is not None and fast[:4] == numpy_check[:4]
        assert fast.columns is not None and numpy_check.columns is not None
        assert fast.columns.heads.tolist() == numpy_check.columns.heads.tolist()
    outcomes = []
    for python_max in (PYTHON_SCAN_MAX, 0):
        try:
            outcomes.append(scan_records(blob, size_max, python_max)[:4])
        except (InvalidRequestError, MessageTooLargeError) as exc:
            outcomes.append((type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]
