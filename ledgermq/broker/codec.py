"""Messages on the client wire <-> message records in the CommitLog.

A SEND_MESSAGES request carries messages as msgpack maps (docs/protocol.md);
`encode_wire_message` validates one and encodes its CommitLog record in one
pass, raising the typed error the client should see. `message_view` is the
map a pull returns.

The `*_field` functions check one identifier of a request body at the edge of
the protocol (topic and group names, queue ids, offsets, client ids): a bad one
is INVALID_REQUEST before anything looks it up, proposes it to the log or
stores it in replicated state.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np

from commitlog import StoredMessage
from commitlog.columns import PYTHON_SCAN_MAX, RecordColumns, queue_groups, scan_body, scan_one
from commitlog.errors import MessageTooLargeError as StorageTooLarge
from commitlog.message import GROUP_NAME_MAX, valid_group, valid_topic
from ledgermq.base.errors import InvalidRequestError, MessageTooLargeError
from ledgermq.base.message_record import MESSAGE_HEAD, MESSAGE_HEAD_SIZE, encode_properties

_U32 = 2**32 - 1
_I64 = 2**63 - 1
_U64 = 2**64 - 1
# Queue ids are u32 in records, but no topic has more than MAX_QUEUES; ids
# beyond the i32 range are refused before any lookup.
QUEUE_ID_MAX = 2**31 - 1
OFFSET_MAX = _I64
# Client ids are free text the SDK makes ("<pid>@<hex>"); printable, bounded.
CLIENT_ID_MAX = 255
# A consumer's subscriptions: topics and their tag expressions.
SUBSCRIPTIONS_MAX = 1024
TAG_EXPRESSION_MAX = 4096


def body_map(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a map")
    return body


def int_field(body: dict[str, Any], key: str, lo: int, hi: int, default: Any = ...) -> int:
    """An integer in [lo, hi]; bools and out-of-range values are INVALID_REQUEST."""
    value = body.get(key, default)
    if type(value) is not int or not lo <= value <= hi:
        raise InvalidRequestError(f"field {key!r} is required and must be an integer"
                                  f" in [{lo}, {hi}]" if value is ... else
                                  f"field {key!r} must be an integer in [{lo}, {hi}],"
                                  f" got {_short(value)}")
    return value


def topic_field(body: dict[str, Any], key: str = "topic") -> str:
    return check_topic(body.get(key), key)


def check_topic(topic: Any, what: str = "topic") -> str:
    if type(topic) is not str or not valid_topic(topic):
        raise InvalidRequestError(
            f"invalid {what} {_short(topic)}: 1-127 characters of [A-Za-z0-9_%|-]")
    return topic


def group_field(body: dict[str, Any], key: str = "group") -> str:
    group = body.get(key)
    if type(group) is not str or not valid_group(group):
        raise InvalidRequestError(
            f"invalid group {_short(group)}: 1-{GROUP_NAME_MAX} characters of [A-Za-z0-9_%|-]")
    return group


def queue_id_field(body: dict[str, Any], key: str = "queue_id") -> int:
    return int_field(body, key, 0, QUEUE_ID_MAX)


def offset_field(body: dict[str, Any], key: str, default: Any = ...) -> int:
    return int_field(body, key, 0, OFFSET_MAX, default)


def client_id_field(body: dict[str, Any], key: str = "client_id") -> str:
    value = body.get(key)
    if type(value) is not str or not 1 <= len(value) <= CLIENT_ID_MAX \
            or not value.isprintable():
        raise InvalidRequestError(
            f"field {key!r} must be 1-{CLIENT_ID_MAX} printable characters")
    return value


def subscriptions_field(body: dict[str, Any], key: str = "subscriptions") -> dict[str, str]:
    subs = body.get(key, {})
    if type(subs) is not dict or len(subs) > SUBSCRIPTIONS_MAX:
        raise InvalidRequestError(
            f"field {key!r} must map at most {SUBSCRIPTIONS_MAX} topics to tag expressions")
    for topic, expression in subs.items():
        check_topic(topic, "subscribed topic")
        if type(expression) is not str or len(expression) > TAG_EXPRESSION_MAX:
            raise InvalidRequestError(
                f"the tag expression of {topic!r} must be a string of at most"
                f" {TAG_EXPRESSION_MAX} characters")
    return subs


def commit_offsets_body(body: Any) -> tuple[str, list[tuple[str, int, int]]]:
    """COMMIT_OFFSETS' {group, offsets: [[topic, queue_id, offset], ...]},
    every identifier checked (the queue against its topic by the handler)."""
    body = body_map(body)
    group = group_field(body)
    raw = body.get("offsets")
    if type(raw) is not list:
        raise InvalidRequestError("field 'offsets' must be a list of [topic, queue_id, offset]")
    items = []
    for i, item in enumerate(raw):
        if type(item) is not list or len(item) != 3:
            raise InvalidRequestError(f"offsets[{i}] must be [topic, queue_id, offset]")
        topic, queue_id, offset = item
        check_topic(topic, f"topic in offsets[{i}]")
        if type(queue_id) is not int or not 0 <= queue_id <= QUEUE_ID_MAX:
            raise InvalidRequestError(
                f"offsets[{i}]: queue id must be an integer in [0, {QUEUE_ID_MAX}],"
                f" got {_short(queue_id)}")
        if type(offset) is not int or not 0 <= offset <= OFFSET_MAX:
            raise InvalidRequestError(
                f"offsets[{i}]: offset must be an integer in [0, {OFFSET_MAX}],"
                f" got {_short(offset)}")
        items.append((topic, queue_id, offset))
    return group, items


def _short(value: Any) -> str:
    """A bad value, quoted for an error message without echoing 70,000 characters."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


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
            f"invalid topic name {_short(topic)}: 1-127 characters of [A-Za-z0-9_%|-]")
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


class Scanned(NamedTuple):
    """A validated SEND_MESSAGES `records` blob (one pass over the record heads)."""

    starts: list[int]  # offset of each record in the blob
    idents: list[tuple[int, int]]  # (producer_id, sequence) per record; (0, 0): none
    topics: dict[str, int]  # topic name (decoded once, here) -> highest queue id used
    firsts: list[int]  # index of the first record of each new (topic, queue), in order
    columns: RecordColumns | None = None  # the blob's scan_body, when it was made


_UNPACK_HEAD = MESSAGE_HEAD.unpack_from
_SIZE = struct.Struct("<I").unpack_from


def scan_records(blob: Any, size_max: int, python_max: int = PYTHON_SCAN_MAX) -> Scanned:
    """Check a blob of CommitLog message records as a client sent it: sizes
    consistent and inside the blob, each record within `size_max`, valid topic
    names, UTF-8 texts, no system flags. Raises InvalidRequestError or
    MessageTooLargeError (`.size`, `.index` on the exception's data). A blob
    of at most `python_max` records is checked in plain Python (the same
    result; numpy's fixed cost per call dominates a one-message request)."""
    if type(blob) is not bytes or not blob:
        raise InvalidRequestError("field 'records' must be non-empty binary")
    scanned = _scan_columns(blob, size_max, python_max)
    # Anything unusual (a bad record, non-ASCII text) takes the record-by-record
    # path, which names the first offending record exactly.
    return scanned if scanned is not None else _scan_one_by_one(blob, size_max)


def _scan_columns(blob: bytes, size_max: int, python_max: int = PYTHON_SCAN_MAX
                  ) -> Scanned | None:
    """The whole-blob check (numpy columns); None when a record needs a closer look."""
    if python_max and len(blob) >= MESSAGE_HEAD_SIZE and _SIZE(blob, 0)[0] == len(blob):
        return _check_one(blob, size_max)
    try:
        columns = scan_body(blob, python_max)
    except ValueError:
        return None
    if len(columns) <= python_max:
        return _check_small(blob, size_max, columns)
    heads = columns.heads
    # A record cannot be larger than the blob holding it.
    if (len(blob) > size_max and int(heads["size"].max()) > size_max) \
            or heads["sys_flag"].any():
        return None
    topics: dict[str, int] = {}
    queue_ids = heads["queue_id"]
    single = len(columns.topics) == 1
    for t, name in enumerate(columns.topics):
        if not valid_topic(name):
            return None
        top = queue_ids.max() if single else queue_ids[columns.topic_ids == t].max()
        topics[name] = int(top)
    # Tags, keys, born host and properties are decoded at pull time: each must
    # be UTF-8.
    if columns.same_meta:
        if not _texts_valid(blob, 0, MESSAGE_HEAD.unpack_from(blob, 0)):
            return None
    else:
        texts = (heads["tags_len"].astype(np.int64) + heads["keys_len"] + heads["host_len"]
                 + heads["props_len"])
        at = columns.starts + MESSAGE_HEAD_SIZE + heads["topic_len"]
        # ASCII is UTF-8, and is what clients send almost always.
        if texts.any() and not all(blob[a : a + n].isascii()
                                   for a, n in zip(at.tolist(), texts.tolist(), strict=True)):
            return None
    firsts = [0 if members is None else members[0] for _, members in queue_groups(columns)]
    starts = columns.starts.tolist()
    idents = list(zip(heads["producer_id"].tolist(), heads["sequence"].tolist(), strict=True))
    return Scanned(starts, idents, topics, firsts, columns)


def _check_one(blob: bytes, size_max: int) -> Scanned | None:
    """`_scan_columns` of a blob that is one record (a producer sending one
    message at a time: the request of the per-message path), without the
    generic loops of `_check_small`."""
    columns = scan_one(blob)
    if columns is None or columns.rows is None:
        return None
    h = columns.rows[0]
    if (h[0] > size_max and len(blob) > size_max) or h[3]:
        return None
    if not valid_topic(columns.topics[0]) or not _texts_valid(blob, 0, h):
        return None
    return Scanned([0], [(h[6], h[7])], {columns.topics[0]: h[1]}, [0], columns)


def _check_small(blob: bytes, size_max: int, columns: RecordColumns) -> Scanned | None:
    """`_scan_columns` for a few records: the same checks and result, on
    the heads as Python tuples (MESSAGE_HEAD's field order) instead of numpy
    reductions."""
    heads = columns.rows if columns.rows is not None else columns.heads.tolist()
    tops: list[int] = [-1] * len(columns.topics)
    for h, t in zip(heads, columns.topic_ids.tolist(), strict=True):
        if (h[0] > size_max and len(blob) > size_max) or h[3]:
            return None
        if h[1] > tops[t]:
            tops[t] = h[1]
    topics: dict[str, int] = {}
    for name, top in zip(columns.topics, tops, strict=True):
        if not valid_topic(name):
            return None
        topics[name] = top
    starts: list[int] = columns.starts.tolist()
    if columns.same_meta:
        if not _texts_valid(blob, 0, heads[0]):
            return None
    else:
        for at, h in zip(starts, heads, strict=True):
            q = at + MESSAGE_HEAD_SIZE + h[9]
            n = h[10] + h[11] + h[12] + h[13]
            if n and not blob[q : q + n].isascii():
                return None
    firsts = [0 if members is None else members[0] for _, members in queue_groups(columns)]
    return Scanned(starts, [(h[6], h[7]) for h in heads], topics, firsts, columns)


def _texts_valid(blob: bytes, offset: int, f: tuple[int, ...]) -> bool:
    """Each of the record's tags, keys, born host and properties is UTF-8."""
    q = offset + MESSAGE_HEAD_SIZE + f[9]
    try:
        for n in f[10:14]:
            if n:
                blob[q : q + n].decode()
            q += n
    except UnicodeDecodeError:
        return False
    return True


def _scan_one_by_one(blob: bytes, size_max: int) -> Scanned:
    starts: list[int] = []
    idents: list[tuple[int, int]] = []
    topics: dict[bytes, int] = {}
    seen: set[tuple[bytes, int]] = set()
    firsts: list[int] = []
    offset = 0
    end = len(blob)
    i = 0
    while offset < end:
        if end - offset < MESSAGE_HEAD_SIZE:
            raise InvalidRequestError(
                f"record {i} is truncated: {end - offset} bytes left for a"
                f" {MESSAGE_HEAD_SIZE}-byte head")
        f = _UNPACK_HEAD(blob, offset)
        size = f[0]
        if size != MESSAGE_HEAD_SIZE + f[9] + f[10] + f[11] + f[12] + f[13] + f[14]:
            raise InvalidRequestError(
                f"record {i}: size {size} does not match its field lengths")
        if offset + size > end:
            raise InvalidRequestError(
                f"record {i} is truncated: {size} bytes announced, {end - offset} left")
        if size > size_max:
            raise MessageTooLargeError(
                f"message {i} of {size} bytes exceeds message_size_bytes_max {size_max}",
                data={"index": i, "size": size, "limit": size_max})
        if f[3]:
            raise InvalidRequestError(f"record {i}: system flags {f[3]} are reserved")
        if f[4] > _I64 or f[5] > _I64:
            raise InvalidRequestError(f"record {i}: timestamps must fit a signed 64-bit int")
        p = offset + MESSAGE_HEAD_SIZE
        q = p + f[9]
        name = blob[p:q]
        top = topics.get(name)
        queue_id = f[1]
        if top is None:
            try:
                ok = valid_topic(name.decode())
            except UnicodeDecodeError:
                ok = False
            if not ok:
                raise InvalidRequestError(
                    f"record {i}: invalid topic name {name!r}: 1-127 characters of"
                    " [A-Za-z0-9_%|-]")
            topics[name] = queue_id
        elif queue_id > top:
            topics[name] = queue_id
        key = (name, queue_id)
        if key not in seen:
            seen.add(key)
            firsts.append(i)
        texts = f[10] + f[11] + f[12] + f[13]
        if texts:
            # Tags, keys, born host and properties are decoded at pull time:
            # each must be UTF-8 on its own.
            try:
                for n in f[10:14]:
                    if n:
                        blob[q : q + n].decode()
                    q += n
            except UnicodeDecodeError:
                raise InvalidRequestError(
                    f"record {i}: tags, keys, born host and properties must be UTF-8"
                ) from None
        starts.append(offset)
        idents.append((f[6], f[7]))
        offset += size
        i += 1
    return Scanned(starts, idents, {name.decode(): top for name, top in topics.items()}, firsts)


class Records(NamedTuple):
    """What one send request hands to group commit: its new records, back to
    back, and where each starts (the leader stamps the store time there)."""

    blob: bytes
    starts: list[int]
    columns: RecordColumns | None = None  # scan_body(blob), if known
