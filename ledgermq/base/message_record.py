"""The message record's fixed head and its properties codec: the layout of
docs/storage-format.md ("Message record") that two floors write.

The producer encodes each message once as a record (`ledgermq.client.records`)
and the broker stores those bytes as they are; the storage engine
(`commitlog.message`) encodes and decodes the same records. Both import the
layout from here, so there is one definition of it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

# size, queue_id, flag, sys_flag, born_ms, store_ms, producer_id, sequence,
# reconsume_times, then the lengths of topic, tags, keys, born host,
# properties and body.
MESSAGE_HEAD = struct.Struct("<IIIIqqQQIHHHHII")
MESSAGE_HEAD_SIZE = MESSAGE_HEAD.size  # 68
assert MESSAGE_HEAD_SIZE == 68

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """`name\\x01value\\x02` per property; ValueError if a name or value holds
    either separator (it could not be decoded back)."""
    if not properties:
        return b""
    parts = []
    for name, value in properties.items():
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a reserved separator byte")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode()


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    result = {}
    for pair in raw.decode().split(PROPERTY_SEPARATOR):
        if pair:
            name, _, value = pair.partition(NAME_VALUE_SEPARATOR)
            result[name] = value
    return result
