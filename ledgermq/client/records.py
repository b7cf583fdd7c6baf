"""Messages as CommitLog records, encoded by the producer (SEND_MESSAGES `records`).

The producer encodes each message once, in the record layout of
docs/storage-format.md ("Message record"), and a request carries the records
of many sends as one binary blob: the broker checks the heads in one pass,
stamps the store time in place and stores the blob as it is, and answers with
O(1) values per request (`decode_reply`), from which each message's id and
queue offset follow here.

The head layout and the properties codec are `ledgermq.base.message_record`,
which the storage engine uses too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from ledgermq.base.message_record import MESSAGE_HEAD, MESSAGE_HEAD_SIZE

HEAD = MESSAGE_HEAD
HEAD_SIZE = MESSAGE_HEAD_SIZE  # 68
_pack_head = HEAD.pack
SEQUENCE_AT = struct.calcsize("<IIIIqqQ")  # 40: where a head's sequence is

# One result per message: (msg_id, queue_id, queue_offset, duplicate).
Result = tuple[str | None, int | None, int | None, bool]


def check_tags_and_keys(tags: bytes, keys: bytes) -> None:
    """ValueError naming the field when tags or keys do not fit the record's
    16-bit length (struct's own error named only its format), or when the
    tag holds '|': a subscription is a tag expression split on '||'
    (`PushConsumer(tags="a||b")`), so no subscription could select a
    message tagged "a||b" (RocketMQ's clients refuse '|' in a tag alike).
    The broker stores any UTF-8 tag; the SDK refuses the mistake where it
    is made."""
    for name, value in (("tags", tags), ("keys", keys)):
        if len(value) > 0xFFFF:
            raise ValueError(f"{name} must be shorter than 65536 bytes (UTF-8), got {len(value)}")
    if b"|" in tags:
        raise ValueError(f"tag {tags[:100].decode(errors='replace')!r} contains '|': a"
                         " subscription's tag expression splits on '||', so none could"
                         " select it")


def encode_record(topic: bytes, queue_id: int, body: bytes, tags: bytes, keys: bytes,
                  host: bytes, props: bytes, flag: int, born_ms: int, producer_id: int,
                  sequence: int) -> bytes:
    """One record, store timestamp 0 (the broker's leader stamps it)."""
    check_tags_and_keys(tags, keys)
    size = HEAD_SIZE + len(topic) + len(tags) + len(keys) + len(host) + len(props) + len(body)
    return b"".join((_pack_head(size, queue_id, flag, 0, born_ms, 0, producer_id, sequence, 0,
                                len(topic), len(tags), len(keys), len(host), len(props),
                                len(body)), topic, tags, keys, host, props, body))


def with_queue(record: bytes, queue_id: int) -> bytes:
    """The same record for another queue (a retry that moved on)."""
    if struct.unpack_from("<I", record, 4)[0] == queue_id:
        return record
    buf = bytearray(record)
    struct.pack_into("<I", buf, 4, queue_id)
    return bytes(buf)


def decode_reply(reply: Any, group: str, records: Sequence[bytes],
                 keys: Sequence[tuple[str, int]]) -> list[Result]:
    """Per-record results of a SEND_MESSAGES reply to `records`, in either
    reply shape; `keys[k]` is record k's (topic, queue id)."""
    results = reply.get("results")
    if results is not None:
        if len(results) != len(records):
            raise ValueError(f"{len(results)} results for {len(records)} records")
        return [(r["msg_id"], r["queue_id"], r["queue_offset"], bool(r.get("duplicate")))
                for r in results]
    at = reply["base"]
    firsts = reply.get("queue_offsets")
    out: list[Result] = []
    append = out.append
    if firsts is None:  # replicate=async: offsets are assigned at commit
        for record, key in zip(records, keys, strict=True):
            append((f"{group}@{at:016X}", key[1], None, False))
            at += len(record)
        return out
    # Records of one (topic, queue) take consecutive offsets from the first.
    nxt: dict[tuple[str, int], int] = {}
    for record, key in zip(records, keys, strict=True):
        offset = nxt.get(key)
        if offset is None:
            offset = firsts[len(nxt)]
        nxt[key] = offset + 1
        append((f"{group}@{at:016X}", key[1], offset, False))
        at += len(record)
    if len(nxt) != len(firsts):
        raise ValueError(f"{len(firsts)} queue offsets for {len(nxt)} queues")
    return out
