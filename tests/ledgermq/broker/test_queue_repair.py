"""Damaged ConsumeQueue units on a real one-node broker: a pull that meets a
unit leading to the wrong bytes gets the right messages anyway (the queue is
rebuilt from the CommitLog while the broker runs), and so does the admin
API's key scan; neither ever serves a message of another queue (a unit
pointing exactly at another topic's record would otherwise hand it out,
past that topic's ACL); and the repaired queue survives a restart. Damage
nothing reads is left for the audit; damage outside a queue file is covered
by test_queue_checkpoint.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from consumequeue.unit import UNIT
from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.message_record import MESSAGE_HEAD_SIZE
from tests.ledgermq.broker.broker_node import Node

pytestmark = pytest.mark.timeout(120)

COUNT = 12
BODIES = [b"m%04d" % i for i in range(COUNT)]


def _queue_file(tmp_path: Path, topic: str = "t") -> Path:
    files = sorted((tmp_path / "n1" / "consumequeue" / topic / "0").iterdir())
    assert len(files) == 1
    return files[0]


async def _fill(node: Node) -> None:
    for topic in ("t", "secret"):
        await node.req(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": 1})
    for i in range(COUNT):
        await node.send("t", BODIES[i], queue_id=0, tags="a" if i % 2 else "b", keys=f"k{i}")
        await node.send("secret", b"s%04d" % i, queue_id=0, keys=f"s{i}")


async def _drain(node: Node, offset: int) -> list[bytes]:
    """What a consumer reads from `offset` of queue t/0 to its end, pull by pull
    (a pull stops before a unit too large for its byte budget)."""
    bodies: list[bytes] = []
    while offset < COUNT:
        reply = await node.req(RequestCode.PULL_MESSAGES, {
            "topic": "t", "queue_id": 0, "offset": offset, "max_messages": 64})
        bodies += [m["body"] for m in reply["messages"]]
        offset = reply["next_offset"]
    return bodies


def _damage(tmp_path: Path, how: str) -> None:
    """Damage unit 5 of queue t/0 while the node is down."""
    path = _queue_file(tmp_path)
    raw = bytearray(path.read_bytes())
    at = 5 * UNIT.size
    offset, size, tag = UNIT.unpack_from(raw, at)
    if how == "offset bit":
        offset ^= 1 << 6
    elif how == "size bit":
        size ^= 1 << 3
    elif how == "size high bit":  # refused before a read of a whole segment
        size ^= 1 << 30
    elif how == "tag hash bit":
        tag ^= 1 << 40
    elif how == "another topic's record":
        secret = UNIT.unpack_from(_queue_file(tmp_path, "secret").read_bytes(), 5 * UNIT.size)
        offset, size = secret[0], secret[1]
    elif how == "behind the unit before":
        offset = UNIT.unpack_from(raw, 4 * UNIT.size)[0]
    UNIT.pack_into(raw, at, offset, size, tag)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["offset bit", "size bit", "size high bit", "tag hash bit",
                                 "another topic's record", "behind the unit before"])
def test_a_pull_through_a_damaged_unit_rebuilds_the_queue_and_serves_the_right_messages(
        tmp_path, how) -> None:
    async def fill() -> None:
        async with Node(tmp_path) as node:
            await _fill(node)

    async def pull_after_damage() -> None:
        async with Node(tmp_path) as node:
            # Two consumers meet the damage at once: one rebuild, both served.
            first, second = await asyncio.gather(_drain(node, 0), _drain(node, 3))
            assert first == BODIES and second == BODIES[3:]
            assert node.broker.status()["queue_repairs"] == {"repaired": 1, "failed": 0}
            # Offsets go on from where they were.
            reply = await node.send("t", b"after", queue_id=0)
            assert reply["queue_offset"] == COUNT
            # A tag filter reads through the rebuilt units too.
            reply = await node.req(RequestCode.PULL_MESSAGES, {
                "topic": "t", "queue_id": 0, "offset": 0, "max_messages": 64, "tags": ["a"]})
            assert [m["body"] for m in reply["messages"]] == BODIES[1::2]

    async def after_restart() -> None:
        async with Node(tmp_path) as node:  # the rebuilt queue was written durably
            assert await node.bodies("t", 0) == [*BODIES, b"after"]
            assert node.broker.status()["queue_repairs"]["repaired"] == 0

    loop.run(fill())
    _damage(tmp_path, how)
    loop.run(pull_after_damage())
    loop.run(after_restart())


@pytest.mark.parametrize("how", ["offset bit", "another topic's record"])
def test_the_admin_key_scan_reads_through_a_damaged_unit_as_a_pull_does(tmp_path, how) -> None:
    """GET /api/v1/messages?topic=&key= checks each unit it reads as a pull
    does: the damaged unit has its queue rebuilt and the scan finds the
    right message. Before, a flipped offset bit failed every scan of the
    topic (INTERNAL), and a unit pointing at another topic's record served
    that record as the scanned topic's, keys and body."""
    async def fill() -> None:
        async with Node(tmp_path) as node:
            await _fill(node)

    async def scan(url: str, key: str) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as session, session.get(
                f"{url}/api/v1/messages", params={"topic": "t", "key": key}) as resp:
            return resp.status, await resp.json()

    async def scan_after_damage() -> None:
        async with Node(tmp_path, admin_listen="127.0.0.1:0") as node:
            assert node.broker.admin is not None
            url = node.broker.admin.url
            status, body = await scan(url, "k5")
            assert status == 200, body
            assert [m["body_text"] for m in body["messages"]] == ["m0005"]
            assert body["scanned"] == COUNT and body["complete"]
            assert node.broker.status()["queue_repairs"] == {"repaired": 1, "failed": 0}
            status, body = await scan(url, "s5")  # the other topic's key
            assert (status, body["messages"]) == (200, [])

    loop.run(fill())
    _damage(tmp_path, how)
    loop.run(scan_after_damage())


def test_damage_a_rebuild_cannot_cure_is_answered_at_once_not_with_a_scan_per_pull(
        tmp_path) -> None:
    """The CommitLog record under a unit is damaged while the broker runs
    (its topic byte, which the unit check sees; its body is not checked on
    a pull, docs/operations.md "Replica repair"): the pull is
    SERVICE_UNAVAILABLE naming the queue (the rebuild's scan meets the
    damaged entry), and another pull soon after is answered the same way
    without scanning the log again."""
    from ledgermq.base.errors import ServiceUnavailableError

    async def main() -> None:
        async with Node(tmp_path) as node:
            await _fill(node)
            unit = node.broker.cq.read("t", 0, 5, 1)[0]
            segment = sorted((tmp_path / "n1" / "commitlog").iterdir())[0]
            with open(segment, "r+b") as f:  # the record's topic: "t" -> "u"
                f.seek(unit.physical_offset + MESSAGE_HEAD_SIZE)
                f.write(b"u")
            for _ in range(2):
                with pytest.raises(ServiceUnavailableError, match="ConsumeQueue t/0"):
                    await node.bodies("t", 0)
            assert node.broker.status()["queue_repairs"] == {"repaired": 0, "failed": 1}

    loop.run(main())


def test_a_unit_size_no_record_can_have_is_refused_before_anything_is_read() -> None:
    """A flipped high bit of a unit's size would have the pull read a whole
    segment into memory before the record failed to decode."""
    from consumequeue import Unit
    from ledgermq.broker.queue_repair import DamagedUnitError, check_read

    reads: list[object] = []

    def read(units: object) -> list:
        reads.append(units)
        return []

    for size in (1 << 30, 3):
        with pytest.raises(DamagedUnitError, match=f"a record cannot be {size} bytes"):
            check_read(("t", 0), [Unit(0, 4096, size, 0)], read, 64 * 1024)
    assert reads == []
