"""The producer's copy of the message record format matches the storage engine's.

`ledgermq.client.records` repeats the record layout of docs/storage-format.md
instead of importing `commitlog.message` (the client shares only `ledgermq`
with the servers, and the storage engine imports nothing of `ledgermq`), so
no one module can own it. These tests keep the two copies one format.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import message
from ledgermq.client import records

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=20)


@given(st.dictionaries(_text, _text, max_size=8))
def test_properties_encode_to_the_same_bytes(properties: dict[str, str]) -> None:
    raw = records.encode_properties(properties)
    assert raw == message.encode_properties(properties)
    assert message.decode_properties(raw) == properties


@pytest.mark.parametrize("bad", [{"a\x01": "v"}, {"a": "v\x02"}, {"\x02": ""}])
def test_both_refuse_a_separator_inside_a_property(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="reserved separator"):
        records.encode_properties(bad)
    with pytest.raises(ValueError, match="reserved separator"):
        message.encode_properties(bad)


def test_the_record_heads_have_one_layout() -> None:
    assert records.HEAD.format == message.MESSAGE_HEAD.format
    assert records.HEAD_SIZE == message.MESSAGE_HEAD_SIZE
