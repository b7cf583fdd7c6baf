"""Cases for a broker's Raft peer port (dledger/runtime/transport.py).

Broken handshakes; a valid handshake (claiming to be another node of the
group) followed by garbage frames; and well-formed-looking messages that a
correct node must refuse: a term, index or position outside 0 .. 2**63 - 1, an
entry kind beyond a byte, a wrong arity or type, or a sender / addressee that
contradicts the handshake.

What is never sent: a fully valid message in range from the claimed peer.
Raft trusts its peers (it is not Byzantine fault tolerant): such a message is
indistinguishable from the real peer's and may legitimately move terms or
replace uncommitted entries. The Raft port must not be reachable by anyone
but the group (docs/fuzzing.md).
"""

from __future__ import annotations

import random
from typing import Any

import msgpack

from chaos.fuzz.plan import Context, Plan
from chaos.fuzz.values import extreme_int, odd_text, random_value
from dledger.runtime.codec import CHANNELS, HELLO_MAGIC, HELLO_VERSION
from ledgermq.wire.codec import HEADER, encode_frame

# The largest term or index a node accepts off the wire (docs/raft.md,
# dledger/runtime/codec.py). Spelt out here rather than imported so that the
# fuzzer also runs against a build from before the check existed.
MAX_TERM_OR_INDEX = 2**63 - 1
# Out of the accepted range: each must make the node drop the connection.
OUT_OF_RANGE: tuple[int, ...] = (MAX_TERM_OR_INDEX + 1, 2**64 - 1, -1, -(2**63))
# Arity of each message type (type code -> number of fields, type included),
# peer protocol version 2: [type, src, dst, term, directory id, ...].
ARITY = {1: 9, 2: 7, 3: 6, 4: 5, 5: 5, 6: 9, 7: 9}
# The longest form each type may take: a HeartbeatResponse (4) may carry the
# follower's last index as a sixth field.
MAX_ARITY = {**ARITY, 4: 6}
_BOOL_FIELDS = {1: (7, 8), 2: (5, 6), 7: (5,)}


def _frame(payload: bytes) -> bytes:
    return encode_frame(payload, compress_threshold=None)


def _peer(rng: random.Random, ctx: Context) -> int:
    others = [n for n in ctx.node_ids if n != ctx.node]
    return rng.choice(others)


def _hello(ctx: Context, src: int, channel: str) -> bytes:
    return _frame(msgpack.packb({"hello": HELLO_MAGIC, "version": HELLO_VERSION,
                                 "group": ctx.group, "src": src, "dst": ctx.node,
                                 "channel": channel}, use_bin_type=True))


def _valid_hello(rng: random.Random, ctx: Context) -> tuple[bytes, int]:
    src = _peer(rng, ctx)
    return _hello(ctx, src, rng.choice(CHANNELS)), src


def _message(rng: random.Random, t: int, src: int, dst: int) -> list[Any]:
    """A message of type `t` with small in-range fields (refused only once broken)."""
    msg: list[Any] = [t, src, dst] + [rng.randint(0, 50) for _ in range(ARITY[t] - 3)]
    for i in _BOOL_FIELDS.get(t, ()):
        msg[i] = rng.random() < 0.5
    if t == 6:
        # A kind of 0..3: a CONFIG entry (4) is checked for its content too.
        msg[8] = [rng.randint(0, 50), rng.randint(0, 3), rng.randint(0, 1 << 20),
                  rng.randbytes(rng.randint(0, 64))]
    return msg


def raw_bytes(rng: random.Random, ctx: Context) -> Plan:
    """Random bytes from the first byte."""
    return Plan([rng.randbytes(rng.choice((0, 1, 5, 6, 64, 4096)))])


def bad_handshake(rng: random.Random, ctx: Context) -> Plan:
    """A handshake with one thing wrong: magic, version, group, sender (itself,
    not a member, extreme), addressee, channel or type; then a message."""
    hello: dict[Any, Any] = {"hello": HELLO_MAGIC, "version": HELLO_VERSION, "group": ctx.group,
                             "src": _peer(rng, ctx), "dst": ctx.node,
                             "channel": rng.choice(CHANNELS)}
    key = rng.choice(["hello", "version", "group", "src", "dst", "channel", "drop", "type"])
    if key == "drop":
        del hello[rng.choice(list(hello))]
    elif key == "type":
        hello = random_value(rng)  # any msgpack value, a map or not
    elif key in ("src", "dst"):
        hello[key] = rng.choice((ctx.node if key == "src" else _peer(rng, ctx), 0, 99,
                                 extreme_int(rng), "1", None))
    elif key == "group":
        hello[key] = rng.choice((odd_text(rng), None, 1, ctx.group + "x"))
    else:
        hello[key] = rng.choice((odd_text(rng), extreme_int(rng), None))
    try:
        payload = msgpack.packb(hello, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        payload = rng.randbytes(20)
    src = hello.get("src", 2) if isinstance(hello, dict) else 2
    src = src if isinstance(src, int) and 0 <= src < 2**64 else 2
    msg = msgpack.packb([3, src, ctx.node, 2**64 - 1, 0])
    return Plan([_frame(payload), _frame(msg)])


def garbage_after_handshake(rng: random.Random, ctx: Context) -> Plan:
    """A valid handshake, then a frame that is not a message batch: random bytes,
    msgpack maps or scalars, empty arrays, unknown types, wrong arity or types,
    or a header with a huge length."""
    hello, src = _valid_hello(rng, ctx)
    roll = rng.random()
    if roll < 0.15:
        return Plan([hello, HEADER.pack(rng.choice((2**32 - 1, 2**30, 64 * 1024 * 1024 + 1)),
                                        rng.choice((0, 1, 0x80))) + rng.randbytes(10)])
    if roll < 0.35:
        payload = rng.randbytes(rng.choice((0, 1, 10, 300)))
    elif roll < 0.5:
        payload = msgpack.packb(random_value(rng), use_bin_type=True)
    elif roll < 0.6:
        payload = msgpack.packb([rng.choice((0, 8, 99, -1, 2**64 - 1, "6", None, 1.0)), src,
                                 ctx.node, 1])
    elif roll < 0.8:
        t = rng.choice(list(ARITY))
        msg = _message(rng, t, src, ctx.node)
        if rng.random() < 0.5:
            msg = msg[: rng.randint(1, len(msg) - 1)] if len(msg) > 1 else msg
        else:
            while len(msg) <= MAX_ARITY[t]:
                msg.append(random_value(rng, 1))
        payload = msgpack.packb(msg, use_bin_type=True)
    else:
        t = rng.choice(list(ARITY))
        msg = _message(rng, t, src, ctx.node)
        i = rng.randint(1, len(msg) - 1)
        # A value of a type the field does not take (a bool where an int
        # belongs, an int where a bool does, never the other bool).
        msg[i] = rng.choice((odd_text(rng), None, 1.5, [1], {"a": 1},
                             1 if isinstance(msg[i], bool) else True))
        payload = msgpack.packb(msg, use_bin_type=True)
    return Plan([hello, _frame(payload)])


def extreme_fields(rng: random.Random, ctx: Context) -> Plan:
    """A valid handshake, then batches of well-formed messages of which each
    has at least one field out of range (term 2**64 - 1 and friends, kind 256,
    indexes running past 2**63 - 1) or a sender/addressee other than the
    handshake's. Must close the connection and change nothing."""
    hello, src = _valid_hello(rng, ctx)
    frames = [hello]
    for _ in range(rng.randint(1, 3)):
        t = rng.choice(list(ARITY))
        msg = _message(rng, t, src, ctx.node)
        how = rng.choice(("range", "range", "range", "kind", "src", "dst", "run"))
        if how == "range":
            ints = [i for i in range(3, len(msg)) if type(msg[i]) is int]
            msg[rng.choice(ints)] = rng.choice(OUT_OF_RANGE)
        elif how == "kind" or (how == "run" and t != 6):
            t = 6
            msg = _message(rng, 6, src, ctx.node)
            msg[8][1] = rng.choice((256, 2**64 - 1, -1))
        elif how == "run":
            msg[5] = MAX_TERM_OR_INDEX  # prev_index: its one entry would be 2**63
        elif how == "src":
            msg[1] = rng.choice([n for n in (*ctx.node_ids, 0, 2**64 - 1) if n != src])
        else:
            msg[2] = rng.choice([n for n in (*ctx.node_ids, 0, 2**64 - 1) if n != ctx.node])
        batch = msgpack.packb(msg, use_bin_type=True)
        if rng.random() < 0.3:
            # Bad message after good-looking ones of the same batch: the whole
            # frame is refused, none of it is delivered.
            good = _message(rng, rng.choice(list(ARITY)), src, ctx.node)
            good[3] = 0  # term 0: stale, ignored even by a node that took it
            batch = msgpack.packb(good, use_bin_type=True) + batch
        frames.append(_frame(batch))
    return Plan(frames)


def wedge_term(rng: random.Random, ctx: Context) -> Plan:
    """The message that wedged the group before the codec checked ranges: a
    heartbeat (or vote) from a claimed peer with term 2**64 - 1."""
    hello, src = _valid_hello(rng, ctx)
    t = rng.choice((3, 1, 5))
    msg = _message(rng, t, src, ctx.node)
    msg[3] = 2**64 - 1
    return Plan([hello, _frame(msgpack.packb(msg, use_bin_type=True))])
