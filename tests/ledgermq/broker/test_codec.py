"""scan_records: the whole-blob (numpy) check and the record-by-record one agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import Message, encode_messages
from ledgermq.base.errors import InvalidRequestError
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
