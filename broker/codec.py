"""Messages on the client wire <-> message records in the CommitLog.

A SEND_MESSAGES request carries messages as msgpack maps (docs/protocol.md);
`encode_wire_message` validates one and encodes its CommitLog record in one
pass, raising the typed error the client should see. `message_view` is the
map a pull returns.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from commitlog import StoredMessage
from commitlog.errors import MessageTooLargeError as StorageTooLarge
from commitlog.message import MESSAGE_HEAD, MESSAGE_HEAD_SIZE, encode_properties, valid_topic
from ledgermq.errors import InvalidRequestError

_U32 = 2**32 - 1
_I64 = 2**63 - 1
_U64 = 2**64 - 1


class Parsed(NamedTuple):
    """One validated message, already encoded as its CommitLog record."""

    record: bytes
    topic: str
    queue_id: int
    producer_id: int
    sequence: int


_INT_FIELDS = (("queue_id", _U32), ("flag", _U32), ("born_timestamp_ms", _I64),
               ("producer_id", _U64), ("sequence", _U64), ("reconsume_times", _U32))


def encode_wire_message(raw: Any, size_max: int) -> Parsed:
    """Validate a wire map and encode its record in one pass (the send hot
    path: no intermediate Message object). Raises InvalidRequestError or
    MessageTooLargeError (with `.size`)."""
    if type(raw) is not dict:
        raise InvalidRequestError("each message must be a map")
    get = raw.get
    topic = get("topic")
    if type(topic) is not str or not valid_topic(topic):
        raise InvalidRequestError(
            f"invalid topic name {topic!r}: 1-127 characters of [A-Za-z0-9_%|-]")
    ints = []
    for key, hi in _INT_FIELDS:
        value = get(key, 0)
        if type(value) is not int or not 0 <= value <= hi:
            raise InvalidRequestError(f"message field {key!r} must be an integer in [0, {hi}]")
        ints.append(value)
    queue_id, flag, born, producer_id, sequence, reconsume = ints
    texts = []
    for key in ("tags", "keys", "born_host"):
        value = get(key, "")
        if type(value) is not str:
            raise InvalidRequestError(f"message field {key!r} must be a string")
        encoded = value.encode()
        if len(encoded) > 0xFFFF:
            raise InvalidRequestError(f"message field {key!r} is longer than 65535 bytes")
        texts.append(encoded)
    tags, keys, host = texts
    body = get("body", b"")
    if type(body) is str:
        body = body.encode()
    elif type(body) is not bytes:
        raise InvalidRequestError("message field 'body' must be binary")
    properties = get("properties")
    props = b""
    if properties:
        if type(properties) is not dict or not all(
                type(k) is str and type(v) is str for k, v in properties.items()):
            raise InvalidRequestError("message field 'properties' must map strings to strings")
        try:
            props = encode_properties(properties)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    name = topic.encode()
    size = (MESSAGE_HEAD_SIZE + len(name) + len(tags) + len(keys) + len(host) + len(props)
            + len(body))
    if size > size_max:
        raise StorageTooLarge("message", size, size_max)
    head = MESSAGE_HEAD.pack(size, queue_id, flag, 0, born, 0, producer_id, sequence, reconsume,
                             len(name), len(tags), len(keys), len(host), len(props), len(body))
    return Parsed(b"".join((head, name, tags, keys, host, props, body)), topic, queue_id,
                  producer_id, sequence)


def message_id(group: str, physical_offset: int) -> str:
    """Cluster-unique offset message id: '<group>@<16 hex physical offset>'."""
    return f"{group}@{physical_offset:016X}"


def message_view(group: str, stored: StoredMessage, queue_offset: int) -> dict[str, Any]:
    m = stored.message
    return {
        "msg_id": message_id(group, stored.physical_offset),
        "topic": m.topic, "queue_id": m.queue_id, "queue_offset": queue_offset,
        "body": m.body, "tags": m.tags, "keys": m.keys, "properties": dict(m.properties),
        "flag": m.flag, "born_timestamp_ms": m.born_timestamp_ms,
        "store_timestamp_ms": m.store_timestamp_ms, "born_host": m.born_host,
        "producer_id": m.producer_id, "sequence": m.sequence,
        "reconsume_times": m.reconsume_times,
    }
