"""Retention on real brokers: segments are deleted once the agreed trim point
and a snapshot allow it, consumers below the first retained message get
OFFSET_MOVED and the SDK continues from it, the admin API and metrics show
it all, and the hard disk watermark refuses sends with DISK_FULL.

One-node groups in this process (a node is its own quorum); the three-node
evidence, on processes, is in test_retention_cluster.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support import require, small_tmpfs

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import DiskFullError, OffsetMovedError
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.retention_policy import disk_usage
from ledgermq.broker.server import Broker
from ledgermq.client import Producer, PullConsumer, PushConsumer
from ledgermq.client.model import MessageQueue
from ledgermq.namesrv.server import NameServer
from ledgermq.wire import RpcClient

pytestmark = pytest.mark.timeout(120)

SEGMENT = 64 * 1024
BODY = 2000  # bytes per message body: ~30 messages per segment


class Node:
    """A NameServer and a one-node broker group with an admin app."""

    def __init__(self, data: Path, **overrides: Any) -> None:
        values: dict[str, Any] = dict(
            group="g1", node_id=1, data_dir=str(data / "n1"),
            peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")},
            segment_size_bytes=SEGMENT, message_size_bytes_max=64 * 1024, tick_ms=10,
            namesrv_register_interval_ms=100, admin_listen="127.0.0.1:0",
            retention_interval_ms=100, snapshot_interval_entries=20,
            # Whatever this machine's disk holds, only the rule under test deletes.
            disk_soft_ratio=1.0, disk_hard_ratio=1.0)
        values.update(overrides)
        self.values = values

    async def __aenter__(self) -> Node:
        self.namesrv = NameServer(expiry_ms=5000)
        host, port = await self.namesrv.start("127.0.0.1", 0)
        self.ns = f"{host}:{port}"
        self.broker = Broker(BrokerConfig(namesrv=(self.ns,), **self.values))
        bhost, bport = await self.broker.start()
        await self.broker.node.wait_leader_ready(10)
        self.client = await RpcClient.connect(bhost, bport)
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.close()
        await self.client.close()
        await self.broker.stop()
        await self.namesrv.close()

    async def req(self, code: int, body: object) -> Any:
        return await self.client.request(code, body)

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.broker.admin is not None
        async with self.http.request(method, f"{self.broker.admin.url}/api/v1/{path}",
                                     json=body) as resp:
            return resp.status, await resp.json()

    async def metrics(self) -> str:
        assert self.broker.admin is not None
        async with self.http.get(f"{self.broker.admin.url}/metrics") as resp:
            return await resp.text()

    async def send(self, count: int, start: int = 0, topic: str = "T") -> None:
        """`count` messages, one request (one entry) each, all on queue 0."""
        for i in range(start, start + count):
            await self.req(RequestCode.SEND_MESSAGES, {"messages": [
                {"topic": topic, "body": body_of(i)}]})


def body_of(i: int) -> bytes:
    return b"%06d" % i + b"." * (BODY - 6)


async def until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def settle(node: Node) -> None:
    """Until retention has nothing left to do: a pass deletes nothing and the
    policy wants no more than the agreed point (nothing is being sent)."""
    retention = node.broker.retention
    assert retention is not None
    quiet = 0
    while quiet < 2:
        deleted = await retention.run_once()
        decision = retention.last_decision
        wants_more = decision is not None and decision.position > node.broker.state.trim
        quiet = 0 if deleted or wants_more else quiet + 1
        await asyncio.sleep(0.05)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


def test_segments_go_and_consumers_continue_from_the_oldest_message(tmp_path) -> None:
    """Size retention (4 segments) on a one-node group: the log is cut whole
    segments at a time below the snapshot, the ConsumeQueue follows, a pull
    at offset 0 answers OFFSET_MOVED, and every consumer flavour reacts as
    configured."""

    async def main() -> None:
        async with Node(tmp_path, retention_bytes=4 * SEGMENT) as node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 1})
            # Groups that committed offset 0 before anything was deleted.
            for group in ("slow", "strict"):
                await node.req(RequestCode.COMMIT_OFFSETS, {"group": group,
                                                            "offsets": [["T", 0, 0]]})
            await node.send(400)  # ~800 KB: ~13 segments
            log_ = node.broker.node.log
            # The size rule, give or take the segment being written.
            await until(lambda: sum(s.length for s in log_.segment_infos()) <= 5 * SEGMENT,
                        30, "retention to delete the oldest segments")
            await settle(node)
            # From here on the log's head stays put: the consumers' offset
            # commits below are entries too, and a snapshot after them would
            # let retention go a segment further under the assertions.
            assert node.broker.retention is not None
            await node.broker.retention.stop()
            infos = log_.segment_infos()
            assert log_.first_index > 1
            assert infos[0].base > 0 and infos[0].base % SEGMENT == 0
            # No file below the first retained segment is left behind.
            names = sorted(os.listdir(os.path.join(node.broker.config.data_dir, "commitlog")))
            assert int(names[0]) == infos[0].base

            lo, hi = node.broker.cq.offsets("T", 0)
            assert lo > 0 and hi == 400
            # The raw answer: OFFSET_MOVED with where the queue starts now.
            with pytest.raises(OffsetMovedError) as moved:
                await node.req(RequestCode.PULL_MESSAGES, {"topic": "T", "queue_id": 0,
                                                           "offset": 0})
            assert moved.value.data == {"min_offset": lo, "max_offset": 400, "requested": 0}
            # Everything retained is readable, in order, from the first offset.
            reply = await node.req(RequestCode.PULL_MESSAGES, {
                "topic": "T", "queue_id": 0, "offset": lo, "max_messages": 1})
            assert reply["messages"][0]["body"] == body_of(lo)
            oldest_ms = reply["messages"][0]["store_timestamp_ms"]

            mq = MessageQueue("T", "g1", 0)
            earliest = PullConsumer([node.ns], "c1")
            strict = PullConsumer([node.ns], "c2", on_offset_moved="error")
            try:
                result = await earliest.pull(mq, 0, 8)
                assert result.moved_from == 0 and result.messages[0].queue_offset == lo
                assert [m.body for m in result.messages] == [body_of(i) for i in range(lo, lo + 8)]
                assert earliest.offsets_moved == 1
                with pytest.raises(OffsetMovedError) as raised:
                    await strict.pull(mq, 3, 8)
                assert raised.value.min_offset == lo and raised.value.requested == 3
            finally:
                await earliest.close()
                await strict.close()

            # A push consumer of the group committed at 0 resumes at the
            # first retained message and commits past the gap.
            got: list[int] = []
            push = PushConsumer([node.ns], "slow", "T", lambda m: got.append(m.queue_offset),
                                long_poll_ms=200)
            await push.start()
            try:
                await until(lambda: len(got) >= 400 - lo, 20, "the push consumer")
            finally:
                await push.stop()
            assert got[0] == lo and got == list(range(lo, 400))
            assert push.offsets_moved >= 1
            assert node.broker.state.offsets[("slow", "T", 0)] == 400

            # With "error" the push consumer stops that queue instead: nothing
            # delivered, the error kept, the committed offset left alone.
            strict_got: list[int] = []
            stopper = PushConsumer([node.ns], "strict", "T",
                                   lambda m: strict_got.append(m.queue_offset),
                                   long_poll_ms=200, on_offset_moved="error")
            await stopper.start()
            try:
                await until(lambda: stopper.failures, 20, "the strict consumer to stop")
                await asyncio.sleep(0.5)
            finally:
                await stopper.stop()
            (failed_mq, error), = stopper.failures.items()
            assert failed_mq == mq and error.min_offset == lo and error.requested == 0
            assert strict_got == [] and node.broker.state.offsets[("strict", "T", 0)] == 0

            # The admin API and the metrics say the same.
            status, view = await node.api("GET", "retention")
            assert status == 200
            assert view["retained"]["first_index"] == log_.first_index > 1
            assert view["retained"]["first_position"] == infos[0].base
            assert view["snapshot"]["index"] >= log_.first_index - 1
            assert view["trim"]["agreed_position"] >= infos[0].base
            assert set(view["trim"]["policy"]["reasons"]) <= {"size"}
            assert view["deleted"]["segments"] >= 7
            assert 0 < view["disk"]["usage_ratio"] < 1 and not view["disk"]["refusing_writes"]
            first_ms, last_ms = view["retained"]["first_time_ms"], view["retained"]["last_time_ms"]
            # One message per entry here: the oldest retained entry's time is
            # the oldest retained message's.
            assert first_ms == oldest_ms and first_ms <= last_ms <= time.time() * 1000
            text = await node.metrics()
            assert metric(text, "ledgermq_retention_segments_deleted_total") >= 7
            assert metric(text, "ledgermq_commitlog_first_index") == log_.first_index
            assert 0 < metric(text, "ledgermq_disk_usage_ratio") < 1
            assert 'ledgermq_request_errors_total{code="OFFSET_MOVED"' in text \
                or 'code="OFFSET_MOVED"' in text

    loop.run(main())


def test_nothing_is_deleted_without_a_snapshot(tmp_path) -> None:
    """The policy wants segments gone (age 0.36 s) but no snapshot exists:
    every segment stays, and the answer says what holds it back."""

    async def main() -> None:
        async with Node(tmp_path, retention_hours=0.0001, snapshot_interval_entries=0,
                        snapshot_interval_bytes=0) as node:
            await node.send(100)
            await asyncio.sleep(1.0)
            log_ = node.broker.node.log
            assert log_.first_index == 1 and log_.segment_infos()[0].base == 0
            _, view = await node.api("GET", "retention")
            assert view["snapshot"] is None
            assert view["trim"]["policy"]["blocked_by"] == "snapshot"
            assert "age" in view["trim"]["policy"]["reasons"]
            assert view["trim"]["agreed_position"] == 0

    loop.run(main())


@pytest.mark.parametrize("queue_checkpoint", ["kept", "damaged"])
def test_age_retention_and_a_restart_from_the_trimmed_log(tmp_path, queue_checkpoint) -> None:
    """Segments older than retention_hours (here 0.72 s) go; the node then
    restarts from its snapshot on a log that starts past entry 1 and keeps
    serving from the first retained message. With its ConsumeQueue checkpoint
    damaged in between, the queues are rebuilt from what the log still holds,
    numbered by the snapshot's counts: the same offsets."""

    async def main() -> tuple[int, int]:
        async with Node(tmp_path, retention_hours=0.0002) as node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 1})
            await node.send(200)
            log_ = node.broker.node.log
            await until(lambda: log_.first_index > 1, 30, "age retention")
            await node.send(5, start=200)
            _, view = await node.api("GET", "retention")
            assert view["trim"]["last_proposed"]["reasons"] == ["age"]
            return log_.first_index, node.broker.cq.offsets("T", 0)[0]

    first_index, lo = loop.run(main())
    assert lo > 0
    checkpoint = tmp_path / "n1" / "consumequeue" / "checkpoint"
    if queue_checkpoint == "damaged":
        raw = checkpoint.read_bytes()
        checkpoint.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))

    async def again() -> None:
        # Retention off this time: what the restart shows is the trimmed log.
        async with Node(tmp_path, retention_hours=0) as node:
            damaged = node.broker.status()["recovery"]["queue_checkpoint_damaged"]
            assert (damaged is not None) == (queue_checkpoint == "damaged"), damaged
            log_ = node.broker.node.log
            assert log_.first_index >= first_index
            lo2, hi = node.broker.cq.offsets("T", 0)
            assert lo2 >= lo and hi == 205
            reply = await node.req(RequestCode.PULL_MESSAGES, {
                "topic": "T", "queue_id": 0, "offset": lo2, "max_messages": 256})
            assert [m["body"] for m in reply["messages"]] == [
                body_of(i) for i in range(lo2, 205)]

    # The same data directory and Raft port: a restart of the same node.
    loop.run(again())


def test_manual_trim_through_the_admin_api(tmp_path) -> None:
    """No automatic retention; an operator's "delete up to index N" is
    proposed through the log and the segments below go once a snapshot
    covers them. Bad input is refused; the point never exceeds the last
    applied entry's segment."""

    async def main() -> None:
        async with Node(tmp_path, retention_hours=0) as node:
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 1})
            await node.send(300)
            log_ = node.broker.node.log
            await asyncio.sleep(0.5)
            assert log_.first_index == 1  # nothing goes by itself
            for bad in ({}, {"index": 5, "position": 5}, {"index": -1}, {"index": "5"}):
                status, answer = await node.api("POST", "retention/trim", bad)
                assert status == 400, (bad, answer)
            target = 150
            status, dry = await node.api("POST", "retention/trim",
                                         {"index": target, "dry_run": True})
            assert status == 200 and dry["dry_run"] and dry["trim"] == 0
            await asyncio.sleep(0.3)
            assert node.broker.state.trim == 0 and log_.first_index == 1
            status, answer = await node.api("POST", "retention/trim", {"index": target})
            assert status == 200, answer
            entry = log_.read_entries(target, target + 1)[0]
            expected = entry.position - entry.position % SEGMENT
            assert answer["position"] == expected and answer["segments"] >= 2
            assert node.broker.state.trim == expected
            await until(lambda: log_.segment_infos()[0].base == expected, 20,
                        "the manual trim to delete")
            assert log_.first_index <= target
            # Asking for the future is clamped to the last applied entry's segment.
            _, far = await node.api("POST", "retention/trim", {"index": 10**9})
            last = log_.read_entries(node.broker.state.applied_index,
                                     node.broker.state.applied_index + 1)[0]
            assert far["clamped"] and far["position"] == last.position - last.position % SEGMENT
            assert log_.segment_infos()[-1].base >= far["position"]

    loop.run(main())


# ------------------------------------------------------------ the watermarks


def test_the_hard_watermark_refuses_sends_with_disk_full(tmp_path, caplog) -> None:
    """Ratios set just under what the disk already uses: sends are refused
    with DISK_FULL at once, the refusal is counted and logged once, control
    operations still pass, and reads are served."""
    used = disk_usage(str(tmp_path)).ratio
    # Skipped locally, failed in CI: the ratio must sit below what is used.
    require(used >= 0.05, f"the disk of {tmp_path} is almost empty ({used:.1%})")
    hard = round(used - 0.03, 4)

    async def main() -> None:
        async with Node(tmp_path, disk_soft_ratio=hard, disk_hard_ratio=hard,
                        snapshot_interval_entries=0, snapshot_interval_bytes=0) as node:
            retention = node.broker.retention
            assert retention is not None
            await until(lambda: retention.refusing, 5, "the disk sample")
            producer = Producer([node.ns], retry_timeout=2.0)
            try:
                with pytest.raises(DiskFullError) as refused:
                    await producer.send("T", b"x")
            finally:
                await producer.close()
            assert "disk_hard_ratio" in str(refused.value)
            assert refused.value.data["hard_ratio"] == hard
            with pytest.raises(DiskFullError):
                await node.req(RequestCode.SEND_MESSAGES, {"messages": [
                    {"topic": "T", "body": b"y"}]})
            # Control operations pass: topics and offsets.
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "U", "queues": 1})
            await node.req(RequestCode.COMMIT_OFFSETS, {"group": "g", "offsets": [["U", 0, 0]]})
            text = await node.metrics()
            assert metric(text, 'ledgermq_writes_refused_total{group="g1",node="1",'
                               'reason="disk_full"}') >= 2
            assert metric(text, "ledgermq_disk_refusing_writes") == 1.0
            _, view = await node.api("GET", "retention")
            assert view["disk"]["refusing_writes"] and view["writes_refused"]["disk_full"] >= 2

    with caplog.at_level(logging.ERROR, logger="ledgermq.broker.retention"):
        loop.run(main())
    lines = [r for r in caplog.records if "refusing new messages" in r.getMessage()]
    assert len(lines) == 1, "one log line when crossing, not one per request"


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "4m") as mount_point:
        yield mount_point


def test_a_filling_disk_is_refused_before_it_is_full_and_recovers(small_disk) -> None:
    """A real 4 MiB tmpfs and no snapshot yet: sends fill it past
    disk_hard_ratio (60%) and are refused with DISK_FULL while the node stays
    healthy (no ENOSPC, nothing acknowledged lost). Once a snapshot exists
    the soft watermark (50%) frees the oldest segments and sends are taken
    again."""

    async def main() -> None:
        async with Node(small_disk, segment_size_bytes=128 * 1024, disk_soft_ratio=0.5,
                        disk_hard_ratio=0.6, snapshot_interval_entries=0,
                        snapshot_interval_bytes=0, retention_hours=0) as node:
            retention = node.broker.retention
            assert retention is not None
            await node.req(RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 1})
            sent = 0
            refusal: Exception | None = None
            for i in range(3000):
                if i % 10 == 0:
                    await retention.sample_disk()
                try:
                    await node.send(1, start=i)
                except DiskFullError as exc:
                    refusal = exc
                    break
                sent += 1
            assert refusal is not None, "the disk never crossed disk_hard_ratio"
            assert node.broker.node.failed is None  # refused, not failed
            assert 0.6 < disk_usage(str(small_disk)).ratio < 0.8
            assert node.broker.cq.offsets("T", 0) == (0, sent)
            # Nothing could go without a snapshot; with one, the soft
            # watermark's pass deletes below it.
            await node.broker.snapshots.snapshot_now()
            await until(lambda: not retention.refusing, 30, "space to be freed")
            assert disk_usage(str(small_disk)).ratio <= 0.6
            await node.send(3, start=sent)
            lo, hi = node.broker.cq.offsets("T", 0)
            assert lo > 0 and hi == sent + 3
            text = await node.metrics()
            assert metric(text, "ledgermq_retention_segments_deleted_total") >= 1

    loop.run(main())
