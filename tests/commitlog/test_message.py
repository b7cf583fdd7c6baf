"""Message record codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import (
    HEADER_SIZE,
    Message,
    MessageTooLargeError,
    decode_messages,
    encode_message,
    encode_messages,
    offset_msg_id,
    tag_hash,
)
from commitlog.message import decode_message_at, valid_group, valid_topic

text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                      blacklist_categories=("Cs",)), max_size=20)
messages = st.builds(
    Message,
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,20}", fullmatch=True),
    body=st.binary(max_size=200),
    queue_id=st.integers(0, 2**32 - 1),
    tags=text, keys=text,
    properties=st.dictionaries(text, text, max_size=4),
    flag=st.integers(0, 2**32 - 1), sys_flag=st.integers(0, 7),
    born_timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    store_timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    born_host=text, producer_id=st.integers(0, 2**64 - 1),
    sequence=st.integers(0, 2**64 - 1), reconsume_times=st.integers(0, 2**32 - 1),
)


@given(st.lists(messages, min_size=1, max_size=8), st.integers(0, 2**40))
def test_batch_round_trip(batch: list[Message], position: int) -> None:
    body = encode_messages(batch, 1 << 20)
    stored = decode_messages(body, position)
    assert [s.message for s in stored] == batch
    # Physical offsets point at each record, and each decodes on its own.
    offset = position + HEADER_SIZE
    for s in stored:
        assert s.physical_offset == offset
        record = body[offset - position - HEADER_SIZE : offset - position - HEADER_SIZE + s.size]
        assert decode_message_at(record, offset).message == s.message
        offset += s.size


def test_oversized_message_is_refused_with_sizes_in_the_error() -> None:
    with pytest.raises(MessageTooLargeError, match="exceeds the limit of 1000 bytes"):
        encode_message(Message("T", b"x" * 1000), 1000)


@pytest.mark.parametrize("topic", ["", "a b", "x" * 128, "tópico", "a/b", "t\n", "t\r\n",
                                   "\nt"])
def test_invalid_topic_names_are_refused(topic: str) -> None:
    assert not valid_topic(topic)
    with pytest.raises(ValueError, match="invalid topic"):
        encode_message(Message(topic, b""), 1 << 20)


def test_group_names_are_matched_whole() -> None:
    assert valid_group("g") and valid_group("%RETRY%g") and valid_group("g" * 255)
    for bad in ("", "g\n", "g" * 256, "g.h", "a b", "é"):
        assert not valid_group(bad), bad


def test_property_separators_are_refused() -> None:
    with pytest.raises(ValueError, match="reserved separator"):
        encode_message(Message("T", b"", properties={"a\x01": "b"}), 1 << 20)


def test_truncated_record_is_an_error() -> None:
    record = encode_message(Message("T", b"hello"), 1 << 20)
    with pytest.raises(ValueError):
        decode_message_at(record[:-1], 0)


def test_ids_and_tag_hash() -> None:
    assert offset_msg_id(0x1234) == "0000000000001234"
    assert tag_hash("") == 0
    assert tag_hash("TagA") == tag_hash(b"TagA") != tag_hash("TagB")
