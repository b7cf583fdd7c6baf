"""Topic deletion that deletes, on a real one-node broker: after DELETE_TOPIC
the name's old messages are never served again — not after sending to the
name again (auto-created or explicitly created), not after a restart, not
after the ConsumeQueues are rebuilt from the CommitLog, not after a start
from a snapshot taken after the deletion."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import UnknownTopicError
from tests.ledgermq.broker.broker_node import Node

pytestmark = pytest.mark.timeout(120)


async def pull_all(node: Node, topic: str, group: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every message a fresh group sees, per queue: (queue offset, body)."""
    topics = (await node.req(RequestCode.GET_TOPICS, None))["topics"]
    out: dict[int, list[tuple[int, bytes]]] = {}
    for queue_id in range(topics[topic]["queues"]):
        committed = (await node.req(RequestCode.QUERY_OFFSET, {
            "group": group, "topic": topic, "queue_id": queue_id}))["offset"]
        offsets = await node.req(RequestCode.GET_QUEUE_OFFSETS,
                                 {"topic": topic, "queue_id": queue_id})
        start = committed if committed >= 0 else offsets["min_offset"]
        reply = await node.req(RequestCode.PULL_MESSAGES, {
            "topic": topic, "queue_id": queue_id, "offset": start, "max_messages": 64,
            "group": group})
        out[queue_id] = [(m["queue_offset"], m["body"]) for m in reply["messages"]]
    return out


@pytest.mark.parametrize("recreate", ["auto", "explicit"])
def test_a_deleted_topic_never_comes_back(tmp_path: Path, recreate: str) -> None:
    # Snapshots every few entries: the later starts restore one taken after
    # the deletion, so `deleted_before` must come through it.
    node = Node(tmp_path, snapshot_interval_entries=4, snapshot_interval_bytes=0,
                default_queues=2)

    async def before_restart() -> dict[int, list[tuple[int, bytes]]]:
        async with node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "d", "queues": 2})
            for i in range(5):
                await node.send("d", b"old-%d" % i, queue_id=i % 2)
            await node.req(RequestCode.COMMIT_OFFSETS, {"group": "old-group",
                                                        "offsets": [["d", 0, 2]]})
            assert await node.req(RequestCode.DELETE_TOPIC, {"topic": "d"}) == {"deleted": True}
            assert "d" not in (await node.req(RequestCode.GET_TOPICS, None))["topics"]
            with pytest.raises(UnknownTopicError):
                await node.req(RequestCode.PULL_MESSAGES, {"topic": "d", "queue_id": 0,
                                                           "offset": 0})
            if recreate == "explicit":
                await node.req(RequestCode.CREATE_TOPIC, {"topic": "d", "queues": 2})
            results = [await node.send("d", b"new-%d" % i, queue_id=i % 2) for i in range(3)]
            # The re-created topic numbers its messages from 0 again.
            assert [(r["queue_id"], r["queue_offset"]) for r in results] == [(0, 0), (1, 0),
                                                                              (0, 1)]
            seen = await pull_all(node, "d", "fresh")
            assert seen == {0: [(0, b"new-0"), (1, b"new-2")], 1: [(0, b"new-1")]}
            # The old group's offset went with the topic.
            assert (await node.req(RequestCode.QUERY_OFFSET, {
                "group": "old-group", "topic": "d", "queue_id": 0}))["offset"] == -1
            for queue_id in (0, 1):
                assert await node.req(RequestCode.GET_QUEUE_OFFSETS, {
                    "topic": "d", "queue_id": queue_id}) == {
                    "min_offset": 0, "max_offset": len(seen[queue_id])}
            # The schedule skips a due snapshot while one is being written (on
            # a busy host the one at index 8 was still in flight when 12 came
            # due): take one now, so that the restart restores a snapshot from
            # after the deletion whatever the host's speed.
            await node.broker.snapshots.snapshot_now()
            await node.broker.snapshots.close()
            return seen

    expected = loop.run(before_restart())

    async def after_restart(rebuilt: bool) -> None:
        async with node:
            recovery = node.recovery()
            assert recovery["snapshot_index"] >= node.broker.state.deleted_before["d"]
            assert await pull_all(node, "d", "fresh-after-restart") == expected
            assert node.broker.state.queue_next == {("d", q): len(m) for q, m in expected.items()}
            if rebuilt:  # the queues were re-indexed from the whole CommitLog
                assert node.broker.cq.recovery.dispatched_index == 0
            # And writing on still continues the new numbering.
            later = len(expected[1])
            assert (await node.send("d", b"later", queue_id=1))["queue_offset"] == later
            await node.broker.snapshots.close()
        expected[1].append((later, b"later"))

    loop.run(after_restart(rebuilt=False))
    # Lose the ConsumeQueues: the start re-indexes the whole CommitLog, which
    # still holds the old messages, and must skip them.
    shutil.rmtree(Path(node.config.data_dir) / "consumequeue")
    loop.run(after_restart(rebuilt=True))


def test_a_deleted_topics_space_is_reclaimed_once_retention_passes_it(tmp_path: Path) -> None:
    """Deleting a topic frees its ConsumeQueue files at once; its CommitLog
    bytes go when retention passes the segments that hold them, and nothing
    of it is served in between or after."""
    from tests.ledgermq.broker.test_retention import SEGMENT, until
    from tests.ledgermq.broker.test_retention import Node as RetentionNode

    async def main() -> None:
        # Retention keeps ~4 segments; snapshots often enough to allow it.
        async with RetentionNode(tmp_path, retention_bytes=4 * SEGMENT,
                                 snapshot_interval_entries=10) as node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "gone", "queues": 1})
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 1})
            await node.send(100, topic="gone")  # ~3 segments of the doomed topic
            log_ = node.broker.node.log
            last_gone = log_.end
            cq_dir = Path(node.broker.config.data_dir) / "consumequeue" / "gone"
            assert cq_dir.exists()
            await node.req(RequestCode.DELETE_TOPIC, {"topic": "gone"})
            assert not cq_dir.exists()  # its queue files go with the deletion
            assert log_.first_index == 1  # its log bytes are still inside retention
            await node.send(300, topic="T")  # pushes the deleted topic's segments out
            # Retention brings the segments to its budget plus the one being
            # written (once a snapshot and the ConsumeQueue checkpoint allow)...
            await until(lambda: sum(i.length for i in log_.segment_infos()) <= 5 * SEGMENT,
                        30, "retention to its budget")
            # ... which passes every segment wholly the deleted topic's.
            assert log_.segment_infos()[0].base >= last_gone - SEGMENT
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "gone", "queues": 1})
            assert await node.req(RequestCode.GET_QUEUE_OFFSETS, {
                "topic": "gone", "queue_id": 0}) == {"min_offset": 0, "max_offset": 0}

    loop.run(main())
