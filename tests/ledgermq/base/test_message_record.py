"""The message record layout both the producer and the storage engine write
(`ledgermq.base.message_record`): one definition, and its properties codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import message
from ledgermq.base import message_record
from ledgermq.client import records

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=20)


@given(st.dictionaries(_text, _text, max_size=8))
def test_properties_round_trip(properties: dict[str, str]) -> None:
    raw = message_record.encode_properties(properties)
    assert message_record.decode_properties(raw) == properties


@pytest.mark.parametrize("bad", [{"a\x01": "v"}, {"a": "v\x02"}, {"\x02": ""}])
def test_a_separator_inside_a_property_is_refused(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="reserved separator"):
        message_record.encode_properties(bad)


def test_producer_and_storage_use_the_one_layout() -> None:
    assert records.HEAD is message.MESSAGE_HEAD is message_record.MESSAGE_HEAD
    assert message.encode_properties is message_record.encode_properties


def test_a_producer_record_decodes_as_the_storage_engine_reads_it() -> None:
    props = message_record.encode_properties({"KEYS": "k1", "x": "y"})
    record = records.encode_record(b"T", 3, b"body", b"tag", b"k1", b"h:1", props, 0, 5, 7, 9)
    stored = message.decode_message_at(record, 0)
    assert (stored.message.topic, stored.message.queue_id, stored.message.body) == ("T", 3, b"body")
    assert stored.message.properties == {"KEYS": "k1", "x": "y"}
    assert (stored.message.producer_id, stored.message.sequence) == (7, 9)
