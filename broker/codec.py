"""Messages on the client wire <-> message records in the CommitLog.

A SEND_MESSAGES request carries messages as msgpack maps (docs/protocol.md);
`parse_message` validates one into a commitlog.Message and raises the typed
error the client should see. `message_view` is the map a pull returns.
"""

from __future__ import annotations

from typing import Any

from commitlog import Message, StoredMessage
from commitlog.message import valid_topic
from ledgermq.errors import InvalidRequestError

_U32 = 2**32 - 1
_I64 = 2**63 - 1
_U64 = 2**64 - 1


def _int(raw: dict, key: str, hi: int, default: int = 0) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= hi:
        raise InvalidRequestError(f"message field {key!r} must be an integer in [0, {hi}]")
    return value


def _str(raw: dict, key: str, default: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequestError(f"message field {key!r} must be a string")
    return value


def parse_message(raw: Any) -> Message:
    """A commitlog.Message from a wire map (store timestamp left 0)."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("each message must be a map")
    topic = _str(raw, "topic")
    if not valid_topic(topic):
        raise InvalidRequestError(
            f"invalid topic name {topic!r}: 1-127 characters of [A-Za-z0-9_%|-]")
    body = raw.get("body", b"")
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes):
        raise InvalidRequestError("message field 'body' must be binary")
    properties = raw.get("properties") or {}
    if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        raise InvalidRequestError("message field 'properties' must map strings to strings")
    for text in (*properties.keys(), *properties.values()):
        if "\x01" in text or "\x02" in text:
            raise InvalidRequestError("property names and values must not contain 0x01 or 0x02")
    return Message(
        topic=topic, body=body, queue_id=_int(raw, "queue_id", _U32), tags=_str(raw, "tags"),
        keys=_str(raw, "keys"), properties=properties, flag=_int(raw, "flag", _U32),
        born_timestamp_ms=_int(raw, "born_timestamp_ms", _I64), born_host=_str(raw, "born_host"),
        producer_id=_int(raw, "producer_id", _U64), sequence=_int(raw, "sequence", _U64),
        reconsume_times=_int(raw, "reconsume_times", _U32),
    )


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
