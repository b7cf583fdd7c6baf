"""Broker-state snapshots on a real one-node broker: the schedule writes them,
a start restores the newest usable one and replays only the log after it,
falls back to an older one when the newest is damaged, and refuses to start
on a log whose head is gone without one. Also the config keys."""

from __future__ import annotations

import os
import shutil

import pytest

from commitlog import CommitLog, CommitLogConfig
from commitlog.snapshot import list_snapshots
from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.broker.config import BrokerConfig, BrokerConfigError, Peer, load_config
from ledgermq.broker.server import NoUsableSnapshotError
from tests.ledgermq.broker.broker_node import Node

pytestmark = pytest.mark.timeout(120)


async def fill(node: Node, count: int, topic: str = "t") -> None:
    """`count` sends of one idempotent message each (one entry each), queue
    i % 2, then an offset commit."""
    await node.req(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": 2})
    for i in range(count):
        await node.send(topic, b"m%04d" % i, queue_id=i % 2, producer_id=7, sequence=i)
    await node.req(RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [[topic, 1, 9]]})
    await node.broker.snapshots.close()  # the write in flight, if any, finishes


async def check_everything_is_there(node: Node, count: int, topic: str = "t") -> None:
    assert await node.bodies(topic, 0) + await node.bodies(topic, 1) == \
        [b"m%04d" % i for i in range(0, count, 2)] + [b"m%04d" % i for i in range(1, count, 2)]
    reply = await node.req(RequestCode.QUERY_OFFSET, {"group": "cg", "topic": topic,
                                                      "queue_id": 1})
    assert reply["offset"] == 9
    # The producer table came through the snapshot: a retry is a duplicate
    # with its original location, a new sequence is stored after the rest.
    again = await node.send(topic, b"retry", queue_id=(count - 1) % 2, producer_id=7,
                            sequence=count - 1)
    assert again["duplicate"] and again["queue_offset"] == (count - 1) // 2
    new = await node.send(topic, b"new", queue_id=0, producer_id=7, sequence=count)
    assert not new["duplicate"] and new["queue_offset"] == (count + 1) // 2


@pytest.mark.parametrize("trigger", ["entries", "bytes"])
def test_a_start_replays_only_the_log_after_the_newest_snapshot(tmp_path, trigger) -> None:
    # About 40 entries between snapshots either way.
    interval = {"snapshot_interval_entries": 40, "snapshot_interval_bytes": 0} \
        if trigger == "entries" else {"snapshot_interval_entries": 0,
                                      "snapshot_interval_bytes": 40 * 150}
    node = Node(tmp_path, **interval)
    count = 400

    async def first() -> tuple[int, float]:
        async with node:
            await fill(node, count)
            figures = node.broker.status()["snapshots"]
            assert figures["written"] >= 5 and figures["failed"] == 0
            log_ = node.broker.node.log
            per_entry = 40 if trigger == "entries" else 40 * 150 / (log_.end / log_.last_index)
            return log_.last_index, per_entry

    async def second(last: int, per_entry: float) -> None:
        async with node:
            recovery = node.recovery()
            snapshot = recovery["snapshot_index"]
            assert recovery["replayed_entries"] == recovery["applied_index"] - snapshot
            # Bounded by the interval (plus what was applied while the last
            # write was in flight, on a loaded machine), not by the log's
            # 400-odd entries.
            assert recovery["replayed_entries"] <= 3 * per_entry < last / 2
            assert recovery["snapshots_rejected"] == []
            await check_everything_is_there(node, count)

    loop.run(second(*loop.run(first())))


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path) -> None:
    node = Node(tmp_path, snapshot_interval_entries=30, snapshot_interval_bytes=0)
    count = 150

    async def first() -> None:
        async with node:
            await fill(node, count)

    loop.run(first())
    older, newest = list_snapshots(node.config.data_dir)  # two kept
    with open(newest.state_path, "r+b") as fh:  # one byte flipped: size right, CRC wrong
        fh.seek(newest.state_bytes // 2)
        byte = fh.read(1)
        fh.seek(newest.state_bytes // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))

    async def second() -> None:
        async with node:
            recovery = node.recovery()
            assert recovery["snapshot_index"] == older.index
            [rejected] = recovery["snapshots_rejected"]
            assert rejected.startswith(f"{newest.index}:") and "CRC" in rejected
            assert recovery["replayed_entries"] == recovery["applied_index"] - older.index
            await check_everything_is_there(node, count)

    loop.run(second())


def test_a_log_without_its_head_needs_a_snapshot_to_start(tmp_path) -> None:
    node = Node(tmp_path, snapshot_interval_entries=20, snapshot_interval_bytes=0,
                segment_size_bytes=8 << 10)
    count = 160

    async def first() -> None:
        async with node:
            await fill(node, count)

    loop.run(first())
    # Retention's effect, done by hand: the first segments are gone.
    with CommitLog.open(node.config.data_dir,
                        CommitLogConfig(segment_size_bytes=8 << 10)) as log_:
        assert len(log_.segments.bases) >= 3
        assert log_.delete_before(log_.segments.bases[1]) == 1
        first_index = log_.first_index
    assert first_index > 1

    async def with_snapshot() -> None:
        async with node:
            recovery = node.recovery()
            assert recovery["first_index"] == first_index
            assert recovery["snapshot_index"] >= first_index
            # The queue counts and offsets come from the snapshot, not a replay.
            assert node.broker.state.queue_next == {("t", 0): count // 2, ("t", 1): count // 2}
            reply = await node.req(RequestCode.QUERY_OFFSET, {"group": "cg", "topic": "t",
                                                              "queue_id": 1})
            assert reply["offset"] == 9

    loop.run(with_snapshot())
    shutil.rmtree(os.path.join(node.config.data_dir, "snapshots"))

    async def without() -> None:
        with pytest.raises(NoUsableSnapshotError, match=f"starts at entry {first_index}"):
            async with node:
                pass

    loop.run(without())


def test_snapshot_interval_keys_are_read_and_checked(tmp_path) -> None:
    path = tmp_path / "b.toml"
    peers = '[peers.1]\nraft = "h:1"\nclient = "h:2"\n'
    path.write_text('group = "g"\nnode_id = 1\ndata_dir = "d"\n'
                    'snapshot_interval_entries = 500\nsnapshot_interval_bytes = 0\n' + peers)
    config = load_config(str(path))
    assert (config.snapshot_interval_entries, config.snapshot_interval_bytes) == (500, 0)
    path.write_text('group = "g"\nnode_id = 1\ndata_dir = "d"\n'
                    'snapshot_interval_bytes = -1\n' + peers)
    with pytest.raises(BrokerConfigError, match="snapshot_interval_bytes"):
        load_config(str(path))
    defaults = BrokerConfig(group="g", node_id=1, data_dir="d", peers={1: Peer("h:1", "h:2")})
    assert defaults.snapshot_interval_entries > 0 and defaults.snapshot_interval_bytes > 0


def test_a_failed_snapshot_write_is_counted_and_retried(tmp_path, monkeypatch) -> None:
    from ledgermq.broker import snapshots

    real = snapshots.write_snapshot
    failures = []

    def flaky(*args: object, **kwargs: object) -> object:
        if not failures:
            failures.append(args[1])
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshots, "write_snapshot", flaky)
    node = Node(tmp_path, snapshot_interval_entries=10, snapshot_interval_bytes=0)

    async def main() -> None:
        async with node:
            await fill(node, 40)
            figures = node.broker.status()["snapshots"]
            assert figures["failed"] == 1 and figures["written"] >= 2
            # The broker went on serving, and the later snapshots cover the failed one.
            assert figures["latest_index"] > failures[0]
            await check_everything_is_there(node, 40)

    loop.run(main())
