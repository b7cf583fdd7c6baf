"""Message records inside a MESSAGES entry body (docs/storage-format.md).

A record is a fixed 68-byte head followed by topic, tags, keys, born host,
properties and body. Encoding a batch joins the records into one entry body,
so one producer batch or one group commit costs one write.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from crc32c import crc32c

from commitlog.entry import HEADER_SIZE
from commitlog.errors import MessageTooLargeError
from ledgermq.base.message_record import (
    MESSAGE_HEAD,
    MESSAGE_HEAD_SIZE,
    decode_properties,
    encode_properties,
)

HeadFields = tuple[int, ...]  # MESSAGE_HEAD's fields, in order

TOPIC_LENGTH_MAX = 127
# Names are matched whole (fullmatch): with re.match, "$" also matches
# before a final newline, and "t\n" was a topic (a ConsumeQueue directory
# named with a newline).
_TOPIC_RE = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
# Consumer group names: RocketMQ's rule, the topic charset up to 255 characters.
GROUP_NAME_MAX = 255
_GROUP_RE = re.compile(r"[A-Za-z0-9_%|-]{1,255}")

SYS_TRANSACTION_MASK = 0b11
SYS_TRANSACTION_PREPARED = 1
SYS_TRANSACTION_COMMIT = 2
SYS_TRANSACTION_ROLLBACK = 3
SYS_DELAYED = 1 << 2


@dataclass(frozen=True, slots=True)
class Message:
    """A message with every RocketMQ field LedgerMQ stores."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    born_host: str = ""
    producer_id: int = 0
    sequence: int = 0
    reconsume_times: int = 0


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A decoded message and where it lives."""

    physical_offset: int
    size: int
    message: Message

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.physical_offset)


def valid_topic(topic: str) -> bool:
    return _TOPIC_RE.fullmatch(topic) is not None


def valid_group(group: str) -> bool:
    """A consumer group name: 1-255 characters of [A-Za-z0-9_%|-]."""
    return _GROUP_RE.fullmatch(group) is not None


def tag_hash(tags: str | bytes) -> int:
    """CRC32C of the tag bytes (0 for no tag): what ConsumeQueue units carry."""
    raw = tags.encode() if isinstance(tags, str) else tags
    return crc32c(raw) if raw else 0


def offset_msg_id(physical_offset: int) -> str:
    return f"{physical_offset:016X}"


def encode_message(message: Message, message_size_bytes_max: int) -> bytes:
    """One record. Raises MessageTooLargeError or ValueError for bad fields."""
    if not valid_topic(message.topic):
        raise ValueError(f"invalid topic name {message.topic!r}")
    topic = message.topic.encode()
    tags = message.tags.encode()
    keys = message.keys.encode()
    host = message.born_host.encode()
    props = encode_properties(message.properties)
    body = message.body
    if len(tags) > 0xFFFF or len(keys) > 0xFFFF or len(host) > 0xFFFF:
        raise ValueError("tags, keys and born_host must each be shorter than 65536 bytes")
    size = MESSAGE_HEAD_SIZE + len(topic) + len(tags) + len(keys) + len(host) + len(props)
    size += len(body)
    if size > message_size_bytes_max:
        raise MessageTooLargeError("message", size, message_size_bytes_max)
    head = MESSAGE_HEAD.pack(
        size, message.queue_id, message.flag, message.sys_flag,
        message.born_timestamp_ms, message.store_timestamp_ms,
        message.producer_id, message.sequence, message.reconsume_times,
        len(topic), len(tags), len(keys), len(host), len(props), len(body),
    )
    return b"".join((head, topic, tags, keys, host, props, body))


def encode_messages(messages: Iterable[Message], message_size_bytes_max: int) -> bytes:
    """A MESSAGES entry body holding every message, in order."""
    return b"".join(encode_message(m, message_size_bytes_max) for m in messages)


def iter_records(body: bytes | memoryview) -> Iterator[tuple[int, HeadFields]]:
    """(offset in body, head fields) of each record; raises ValueError if malformed."""
    offset = 0
    end = len(body)
    unpack = MESSAGE_HEAD.unpack_from
    while offset < end:
        if end - offset < MESSAGE_HEAD_SIZE:
            raise ValueError(f"truncated message head at body offset {offset}")
        fields = unpack(body, offset)
        size = fields[0]
        lengths = sum(fields[9:15])
        if size != MESSAGE_HEAD_SIZE + lengths or offset + size > end:
            raise ValueError(f"message size {size} inconsistent at body offset {offset}")
        yield offset, fields
        offset += size


def decode_record(body: bytes | memoryview, offset: int, fields: HeadFields) -> Message:
    (_size, queue_id, flag, sys_flag, born, store, producer_id, sequence, reconsume,
     topic_len, tags_len, keys_len, host_len, props_len, body_len) = fields
    p = offset + MESSAGE_HEAD_SIZE
    raw = bytes(body[p : p + topic_len + tags_len + keys_len + host_len + props_len + body_len])
    q = 0
    topic = raw[q : q + topic_len].decode()
    q += topic_len
    tags = raw[q : q + tags_len].decode()
    q += tags_len
    keys = raw[q : q + keys_len].decode()
    q += keys_len
    host = raw[q : q + host_len].decode()
    q += host_len
    props = decode_properties(raw[q : q + props_len])
    q += props_len
    return Message(
        topic=topic, body=raw[q : q + body_len], queue_id=queue_id, tags=tags, keys=keys,
        properties=props, flag=flag, sys_flag=sys_flag, born_timestamp_ms=born,
        store_timestamp_ms=store, born_host=host, producer_id=producer_id,
        sequence=sequence, reconsume_times=reconsume,
    )


def decode_messages(body: bytes | memoryview, entry_position: int) -> list[StoredMessage]:
    """Every message of a MESSAGES entry body, with its physical offset."""
    base = entry_position + HEADER_SIZE
    return [
        StoredMessage(base + offset, fields[0], decode_record(body, offset, fields))
        for offset, fields in iter_records(body)
    ]


def decode_message_at(record: bytes | memoryview, physical_offset: int) -> StoredMessage:
    """Decode a single record read from the log by (physical offset, size)."""
    records = list(iter_records(record))
    if len(records) != 1:
        raise ValueError(f"expected one message at {physical_offset}, found {len(records)}")
    offset, fields = records[0]
    return StoredMessage(physical_offset, fields[0], decode_record(record, offset, fields))


def with_store_timestamp(record: bytes, store_timestamp_ms: int) -> bytes:
    """Return `record` with its store timestamp set (the leader stamps at append)."""
    buf = bytearray(record)
    struct.pack_into("<q", buf, 24, store_timestamp_ms)
    return bytes(buf)
