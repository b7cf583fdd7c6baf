"""Structure-aware request bodies for every request code of the wire protocol.

`SCHEMAS` maps each `RequestCode` to a builder of a plausible body (the shapes
of docs/protocol.md); `body_for` builds one and then breaks it a random number
of times: a field dropped, a value of the wrong type, an extreme integer, a
huge string, unknown keys, or the whole body replaced. Codes added to
`RequestCode` later and not yet described here still get fuzzed with random
bodies (`body_for` falls back to `random_value`), and a test lists the codes
that lack a schema so they get one.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

from chaos.fuzz.values import (
    Names,
    deep_nesting,
    extreme_int,
    huge_text,
    odd_text,
    random_value,
)
from ledgermq.base.codes import RequestCode
from ledgermq.base.message_record import encode_properties
from ledgermq.client.records import encode_record

Builder = Callable[[random.Random, Names], Any]


def _small(rng: random.Random) -> int:
    return rng.choice((0, 0, 1, 2, 3, 7, 8, 31, 32, 1000))


def _int(rng: random.Random) -> int:
    return extreme_int(rng) if rng.random() < 0.3 else _small(rng)


def _record(rng: random.Random, names: Names) -> bytes:
    """One message record, valid most of the time, with a field broken sometimes."""
    topic = names.topic(rng).encode("utf-8", "surrogatepass")[:200]
    props = encode_properties({"k": "v"}) if rng.random() < 0.3 else b""
    record = encode_record(topic, _small(rng) % 8, rng.randbytes(rng.choice((0, 1, 100))),
                           b"tag" if rng.random() < 0.5 else b"", b"", b"h:1", props, 0,
                           0, rng.choice((0, rng.getrandbits(63))), rng.randint(0, 100))
    if rng.random() < 0.5:
        return record
    buf = bytearray(record)
    roll = rng.random()
    if roll < 0.3:
        # A head field overwritten with an extreme value (size, queue id, sys flag,
        # timestamps, lengths).
        offset, fmt = rng.choice(((0, "<I"), (4, "<I"), (12, "<I"), (16, "<q"), (24, "<q"),
                                  (52, "<H"), (54, "<H"), (60, "<I"), (64, "<I")))
        bits = struct.calcsize(fmt) * 8
        value = rng.choice((0, 1, 2 ** (bits - 1) - 1, 2**bits - 1 if fmt[1].isupper() else -1))
        struct.pack_into(fmt, buf, offset, value)
    elif roll < 0.6:
        del buf[rng.randint(0, len(buf)):]
    else:
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def _message(rng: random.Random, names: Names) -> dict[str, Any]:
    return {"topic": names.topic(rng), "body": rng.randbytes(rng.choice((0, 10, 100))),
            "queue_id": _int(rng), "tags": odd_text(rng), "keys": odd_text(rng),
            "properties": {odd_text(rng): odd_text(rng)}, "flag": _int(rng),
            "born_timestamp_ms": _int(rng), "born_host": odd_text(rng),
            "producer_id": _int(rng), "sequence": _int(rng), "reconsume_times": _int(rng)}


def _send(rng: random.Random, names: Names) -> dict[str, Any]:
    if rng.random() < 0.6:
        records = b"".join(_record(rng, names) for _ in range(rng.randint(1, 5)))
        body: dict[str, Any] = {"records": records}
        if rng.random() < 0.5:
            body["count"] = rng.choice((1, 2, 5, 0, -1, 2**63))
        return body
    return {"messages": [_message(rng, names) for _ in range(rng.randint(0, 4))]}


def _registration(rng: random.Random, names: Names) -> dict[str, Any]:
    return {"cluster": names.pick(rng, ("fz-cluster",)), "group": names.group(rng),
            "node_id": names.pick(rng, ("n0", "n1")), "address": f"127.0.0.1:{_int(rng)}",
            "role": rng.choice(("leader", "follower", "candidate", odd_text(rng))),
            "term": _int(rng),
            "topics": {names.topic(rng): {"queues": _int(rng), "perm": _int(rng)}
                       for _ in range(rng.randint(0, 3))}}


def _group_node(rng: random.Random, names: Names) -> dict[str, Any]:
    return {"group": names.group(rng), "node_id": names.pick(rng, ("n0", "n1"))}


def _topic_queue(rng: random.Random, names: Names) -> dict[str, Any]:
    return {"topic": names.topic(rng), "queue_id": _int(rng)}


def _perm(rng: random.Random) -> Any:
    return rng.choice(("PUB", "SUB", "PUB|SUB", "DENY", odd_text(rng), _int(rng)))


def _acl_user(rng: random.Random, names: Names) -> dict[str, Any]:
    return {"access_key": rng.choice(("fz-user", "cluster", "admin", odd_text(rng))),
            "secret": rng.choice((rng.randbytes(16), rng.randbytes(3), odd_text(rng))),
            "admin": rng.choice((False, True, _int(rng))),
            "allow": rng.choice(([], ["127.0.0.1/32"], ["10.0.0.0/99"], [odd_text(rng)])),
            "topics": {names.topic(rng): _perm(rng) for _ in range(rng.randint(0, 3))},
            "groups": {names.group(rng): _perm(rng) for _ in range(rng.randint(0, 2))}}


SCHEMAS: dict[RequestCode, Builder] = {
    RequestCode.HELLO: lambda rng, names: {
        "version": rng.choice((1, 1, 0, 2, _int(rng))),
        "role": rng.choice(("client", "broker", "peer", "admin", odd_text(rng))),
        "name": odd_text(rng)},
    RequestCode.PING: lambda rng, names: random_value(rng),
    RequestCode.AUTH: lambda rng, names: {
        "access_key": rng.choice(("cluster", "admin", odd_text(rng))),
        "nonce": rng.choice((rng.randbytes(16), rng.randbytes(rng.randint(0, 40)), _int(rng))),
        "proof": rng.choice((rng.randbytes(32), rng.randbytes(rng.randint(0, 64)),
                             odd_text(rng)))},
    RequestCode.REGISTER_BROKER: _registration,
    RequestCode.UNREGISTER_BROKER: _group_node,
    RequestCode.BROKER_HEARTBEAT: _group_node,
    RequestCode.GET_ROUTE: lambda rng, names: {"topic": names.topic(rng)},
    RequestCode.GET_CLUSTER: lambda rng, names: None,
    RequestCode.SEND_MESSAGES: _send,
    RequestCode.PULL_MESSAGES: lambda rng, names: {
        **_topic_queue(rng, names), "offset": _int(rng), "max_messages": _int(rng),
        "tags": rng.choice((None, ["*"], [odd_text(rng)], [])),
        # Long polls are capped by the broker; keep most cases short.
        "wait_ms": rng.choice((0, 0, 1, 50, _int(rng)))},
    RequestCode.CREATE_TOPIC: lambda rng, names: {
        "topic": names.topic(rng), "queues": rng.choice((1, 4, 8, _int(rng))),
        "perm": rng.choice((6, 4, 2, 0, _int(rng)))},
    RequestCode.DELETE_TOPIC: lambda rng, names: {"topic": names.topic(rng)},
    RequestCode.GET_TOPICS: lambda rng, names: None,
    RequestCode.COMMIT_OFFSETS: lambda rng, names: {
        "group": names.group(rng),
        "offsets": [[names.topic(rng), _int(rng), _int(rng)] for _ in range(rng.randint(0, 4))]},
    RequestCode.QUERY_OFFSET: lambda rng, names: {"group": names.group(rng),
                                                  **_topic_queue(rng, names)},
    RequestCode.CLIENT_HEARTBEAT: lambda rng, names: {
        "group": names.group(rng), "client_id": odd_text(rng),
        "subscriptions": {names.topic(rng): rng.choice(("*", "a || b", odd_text(rng)))},
        "mode": rng.choice(("clustering", "broadcasting", odd_text(rng))),
        "leave": rng.random() < 0.3},
    RequestCode.GET_MEMBERS: lambda rng, names: {"group": names.group(rng)},
    RequestCode.GET_QUEUE_OFFSETS: _topic_queue,
    RequestCode.BROKER_STATUS: lambda rng, names: None,
    RequestCode.ACL_PUT_USER: _acl_user,
    RequestCode.ACL_DELETE_USER: lambda rng, names: {
        "access_key": rng.choice(("fz-user", odd_text(rng)))},
    RequestCode.ACL_GET_USERS: lambda rng, names: None,
    RequestCode.ACL_GRANT: lambda rng, names: {
        "access_key": rng.choice(("fz-user", odd_text(rng))),
        "topics": {names.topic(rng): _perm(rng)}, "groups": {names.group(rng): _perm(rng)}},
    RequestCode.ACL_REVOKE: lambda rng, names: {
        "access_key": rng.choice(("fz-user", odd_text(rng))),
        "topics": [names.topic(rng)], "groups": [names.group(rng)]},
}


def _wrong(rng: random.Random) -> Any:
    """A value of a random type, often not the one the field wants."""
    roll = rng.random()
    if roll < 0.3:
        return extreme_int(rng)
    if roll < 0.4:
        return huge_text(rng)
    if roll < 0.45:
        return deep_nesting(rng, rng.choice((10, 100, 400)))
    return random_value(rng, 2)


def mutate(rng: random.Random, body: Any) -> Any:
    """Break `body` 0 to 3 times; about a third of bodies stay as built."""
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
        if not isinstance(body, dict) or not body or rng.random() < 0.1:
            body = _wrong(rng) if rng.random() < 0.7 else body
            continue
        key = rng.choice(list(body))
        roll = rng.random()
        if roll < 0.25:
            del body[key]
        elif roll < 0.85:
            body[key] = _wrong(rng)
        else:
            body[rng.choice((odd_text(rng), extreme_int(rng)))] = random_value(rng, 1)
    return body


def body_for(code: int, rng: random.Random, names: Names) -> Any:
    """A body for request `code`: built from its schema and mutated, or random."""
    try:
        builder = SCHEMAS.get(RequestCode(code))
    except ValueError:
        builder = None
    if builder is None:
        return random_value(rng)
    return mutate(rng, builder(rng, names))
