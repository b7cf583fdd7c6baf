"""A damaged ConsumeQueue dispatch checkpoint on a real one-node broker: the
node starts anyway, rebuilds every queue from its CommitLog with its state's
counts, says so in its status, and serves the same messages at the same
offsets (the queues are derived data; the log and the state are the truth).
The trimmed-log case (retention deleted the head) is in test_retention.py."""

from __future__ import annotations

import msgpack
import pytest
from crc32c import crc32c

from consumequeue.checkpoint import read_dispatch_checkpoint
from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from tests.ledgermq.broker.broker_node import Node

pytestmark = pytest.mark.timeout(120)

COUNT = 40


def _forged(raw: bytes) -> bytes:
    """A map with the CRC intact but a queue row of the wrong shape."""
    payload = msgpack.packb({"version": 1, "dispatched_index": 3, "dispatched_end": 10,
                             "queues": [["t", 0]], "files_synced": True})
    return payload + crc32c(payload).to_bytes(4, "little")


DAMAGE = {
    "bit flip": lambda raw: raw[:5] + bytes([raw[5] ^ 0x01]) + raw[6:],
    "torn": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "forged": _forged,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_dispatch_checkpoint_is_rebuilt_from_the_log(tmp_path, damage) -> None:
    checkpoint = tmp_path / "n1" / "consumequeue" / "checkpoint"

    async def fill() -> None:
        async with Node(tmp_path) as node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
            for i in range(COUNT):
                await node.send("t", b"m%04d" % i, queue_id=i % 2, producer_id=7, sequence=i)
            await node.req(RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 1, 9]]})

    async def restart() -> None:
        async with Node(tmp_path) as node:
            recovery = node.recovery()
            assert "dispatch checkpoint" in recovery["queue_checkpoint_damaged"]
            assert recovery["queues_rebuilt"] == 2
            assert await node.bodies("t", 0) == [b"m%04d" % i for i in range(0, COUNT, 2)]
            assert await node.bodies("t", 1) == [b"m%04d" % i for i in range(1, COUNT, 2)]
            reply = await node.req(RequestCode.QUERY_OFFSET, {"group": "cg", "topic": "t",
                                                              "queue_id": 1})
            assert reply["offset"] == 9
            # The numbering goes on where it was: a retry is a duplicate at its
            # original offset, a new message takes the next slot.
            again = await node.send("t", b"retry", queue_id=1, producer_id=7,
                                    sequence=COUNT - 1)
            assert again["duplicate"] and again["queue_offset"] == COUNT // 2 - 1
            new = await node.send("t", b"new", queue_id=0, producer_id=7, sequence=COUNT)
            assert not new["duplicate"] and new["queue_offset"] == COUNT // 2
        # The rebuild left a good checkpoint behind.
        assert read_dispatch_checkpoint(str(checkpoint.parent)) is not None

    loop.run(fill())
    raw = checkpoint.read_bytes()
    assert read_dispatch_checkpoint(str(checkpoint.parent)) is not None
    checkpoint.write_bytes(DAMAGE[damage](raw))
    loop.run(restart())
