"""Broker handlers over real sockets, in one process, on a one-node Raft group.

A single node is its own quorum, so these tests pin the client protocol —
every request, every error code — and the SDK without replication timing in
the way; the multi-process tests (test_cluster.py) cover replication,
followers and failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

import aiohttp
import pytest
from support import small_tmpfs

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    DiskFullError,
    InvalidRequestError,
    LedgerMQError,
    MalformedFrameError,
    MessageTooLargeError,
    NoPermissionError,
    OffsetOutOfRangeError,
    ServiceUnavailableError,
    UnknownRequestError,
    UnknownTopicError,
)
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.client import Producer, PullConsumer, PushConsumer
from ledgermq.client.model import MessageQueue
from ledgermq.namesrv.server import NameServer
from ledgermq.wire import RpcClient

pytestmark = pytest.mark.timeout(60)


def make_config(tmp_path, **overrides) -> BrokerConfig:
    values = dict(
        group="g1", node_id=1, data_dir=str(tmp_path / "n1"),
        peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")},
        segment_size_bytes=1 << 20, message_size_bytes_max=64 * 1024, tick_ms=10,
        namesrv_register_interval_ms=100,
    )
    values.update(overrides)
    return BrokerConfig(**values)


class Env:
    def __init__(self, tmp_path, **overrides) -> None:
        self.tmp_path = tmp_path
        self.overrides = overrides
        self.namesrv: NameServer | None = None
        self.broker: Broker | None = None

    async def __aenter__(self) -> Env:
        self.namesrv = NameServer(expiry_ms=5000)
        host, port = await self.namesrv.start("127.0.0.1", 0)
        self.ns = f"{host}:{port}"
        config = make_config(self.tmp_path, namesrv=(self.ns,), **self.overrides)
        self.broker = Broker(config)
        bhost, bport = await self.broker.start()
        await self.broker.node.wait_leader_ready(10)
        self.address = f"{bhost}:{bport}"
        self.client = await RpcClient.connect(bhost, bport)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.broker.stop()
        await self.namesrv.close()

    async def req(self, code: int, body: object) -> dict:
        return await self.client.request(code, body)

    async def wait_route(self, topic: str) -> None:
        for _ in range(200):
            with contextlib.suppress(UnknownTopicError):
                self.namesrv.registry.route(topic)
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no route for {topic}")


def msg(topic: str, body: bytes, **fields) -> dict:
    return {"topic": topic, "body": body, **fields}


def run(coro):
    return loop.run(coro)


def test_send_pull_roundtrip_with_tags_and_offsets(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
            reply = await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                msg("t", b"a", tags="x", keys="k1"), msg("t", b"b", tags="y"),
                msg("t", b"c", tags="x", properties={"p": "v"}), msg("t", b"d", queue_id=1)]})
            results = reply["results"]
            assert [r["queue_offset"] for r in results] == [0, 1, 2, 0]
            assert all(r["msg_id"].startswith("g1@") and len(r["msg_id"]) == 19 for r in results)
            pulled = await env.req(RequestCode.PULL_MESSAGES,
                                   {"topic": "t", "queue_id": 0, "offset": 0})
            assert [m["body"] for m in pulled["messages"]] == [b"a", b"b", b"c"]
            assert pulled["next_offset"] == 3 and pulled["max_offset"] == 3
            assert pulled["messages"][2]["properties"] == {"p": "v"}
            assert pulled["messages"][0]["store_timestamp_ms"] > 0
            assert pulled["messages"][0]["msg_id"] == results[0]["msg_id"]
            filtered = await env.req(RequestCode.PULL_MESSAGES,
                                     {"topic": "t", "queue_id": 0, "offset": 0, "tags": ["x"]})
            assert [m["body"] for m in filtered["messages"]] == [b"a", b"c"]
            assert filtered["next_offset"] == 3
            await env.req(RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 2]]})
            got = await env.req(RequestCode.QUERY_OFFSET,
                                {"group": "cg", "topic": "t", "queue_id": 0})
            assert got == {"offset": 2}
            # Offsets only move forward.
            await env.req(RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 1]]})
            got = await env.req(RequestCode.QUERY_OFFSET,
                                {"group": "cg", "topic": "t", "queue_id": 0})
            assert got == {"offset": 2}
            topics = await env.req(RequestCode.GET_TOPICS, None)
            assert topics["topics"]["t"]["queues"] == 2
    run(main())


def test_state_survives_restart(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1, "perm": 6})
            await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                msg("t", b"%d" % i, producer_id=7, sequence=i) for i in range(5)]})
            await env.req(RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 3]]})
        async with Env(tmp_path) as env:
            assert (await env.req(RequestCode.QUERY_OFFSET,
                                  {"group": "cg", "topic": "t", "queue_id": 0}))["offset"] == 3
            again = await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                msg("t", b"4", producer_id=7, sequence=4), msg("t", b"5", producer_id=7,
                                                               sequence=5)]})
            assert again["results"][0]["duplicate"] and again["results"][0]["queue_offset"] == 4
            assert not again["results"][1]["duplicate"]
            assert again["results"][1]["queue_offset"] == 5
            # Two concurrent sends of one (producer id, sequence): stored once.
            first, second = await asyncio.gather(*(env.req(RequestCode.SEND_MESSAGES, {
                "messages": [msg("t", b"6", producer_id=7, sequence=6)]}) for _ in range(2)))
            assert first["results"][0]["msg_id"] == second["results"][0]["msg_id"]
            assert {first["results"][0]["duplicate"], second["results"][0]["duplicate"]} == {
                False, True}
            pulled = await env.req(RequestCode.PULL_MESSAGES,
                                   {"topic": "t", "queue_id": 0, "offset": 0, "max_messages": 99})
            assert [m["body"] for m in pulled["messages"]] == [
                b"0", b"1", b"2", b"3", b"4", b"5", b"6"]
    run(main())


def test_long_poll_waits_for_a_message(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            poll = asyncio.create_task(env.req(RequestCode.PULL_MESSAGES, {
                "topic": "t", "queue_id": 0, "offset": 0, "wait_ms": 10_000}))
            while env.broker.longpoll.waiting == 0:
                await asyncio.sleep(0.01)
            assert not poll.done()
            await env.req(RequestCode.SEND_MESSAGES, {"messages": [msg("t", b"late")]})
            reply = await poll
            assert [m["body"] for m in reply["messages"]] == [b"late"]
            empty = await env.req(RequestCode.PULL_MESSAGES, {
                "topic": "t", "queue_id": 0, "offset": 1, "wait_ms": 50})
            assert empty["messages"] == [] and empty["next_offset"] == 1
    run(main())


def test_bad_input_gets_distinct_codes_and_loses_nothing(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path, auto_create_topics=False) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "ro", "queues": 1, "perm": 4})
            stored = await env.req(RequestCode.SEND_MESSAGES, {"messages": [msg("t", b"keep")]})
            codes = {}
            cases = {
                "unknown_request": (399, {}),
                "unknown_topic": (RequestCode.SEND_MESSAGES, {"messages": [msg("nope", b"x")]}),
                "too_large": (RequestCode.SEND_MESSAGES,
                              {"messages": [msg("t", b"x" * 70_000)]}),
                "out_of_range": (RequestCode.PULL_MESSAGES,
                                 {"topic": "t", "queue_id": 0, "offset": 5}),
                "commit_beyond_end": (RequestCode.COMMIT_OFFSETS,
                                      {"group": "g", "offsets": [["t", 0, 9]]}),
                "read_only": (RequestCode.SEND_MESSAGES, {"messages": [msg("ro", b"x")]}),
                "invalid": (RequestCode.PULL_MESSAGES, {"topic": "t"}),
                "bad_queue": (RequestCode.SEND_MESSAGES, {"messages": [msg("t", b"x",
                                                                           queue_id=3)]}),
            }
            for name, (code, body) in cases.items():
                with pytest.raises(LedgerMQError) as info:
                    await env.req(code, body)
                codes[name] = (info.value.code, type(info.value))
            assert codes["unknown_request"][1] is UnknownRequestError
            assert codes["unknown_topic"][1] is UnknownTopicError
            assert codes["too_large"][1] is MessageTooLargeError
            assert codes["out_of_range"][1] is OffsetOutOfRangeError
            assert codes["commit_beyond_end"][1] is OffsetOutOfRangeError
            assert codes["read_only"][1] is NoPermissionError
            assert codes["invalid"][1] is InvalidRequestError
            assert codes["bad_queue"][1] is InvalidRequestError
            assert len({code for code, _ in codes.values()}) == 6
            with pytest.raises(OffsetOutOfRangeError) as info:
                await env.req(RequestCode.PULL_MESSAGES, {"topic": "t", "queue_id": 0,
                                                          "offset": 5})
            assert info.value.data == {"min_offset": 0, "max_offset": 1}

            # Malformed and truncated frames close that connection only.
            host, port = env.address.split(":")
            other = await RpcClient.connect(host, int(port))
            for junk in (struct.pack(">IB", 5, 0) + b"\xc1\xc1\xc1\xc1\xc1",
                         struct.pack(">IB", 100, 0) + b"\x80"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(junk)
                await writer.drain()
                writer.write_eof()
                async with asyncio.timeout(5):
                    answer = await reader.read()
                assert answer  # one error frame, then end of stream
                writer.close()
            bad = await RpcClient.connect(host, int(port))
            bad._writer.send(b"\x00\x00\x00\x03\x00\xc1\xc1\xc1")
            with pytest.raises(MalformedFrameError):
                await bad.request(RequestCode.PING, 1)
            assert bad.closed
            await bad.close()
            assert await other.request(RequestCode.PING, 7) == 7
            await other.close()
            pulled = await env.req(RequestCode.PULL_MESSAGES,
                                   {"topic": "t", "queue_id": 0, "offset": 0})
            assert [m["body"] for m in pulled["messages"]] == [b"keep"]
            assert pulled["messages"][0]["msg_id"] == stored["results"][0]["msg_id"]
    run(main())


def test_sdk_producer_and_push_consumer(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            producer = Producer([env.ns])
            await producer.create_topic("orders", queues=4)
            await env.wait_route("orders")
            sent = [await producer.send("orders", b"m%d" % i, tags="a" if i % 2 else "b")
                    for i in range(20)]
            batch = await producer.send_batch("orders", [b"x", b"y"], sharding_key="k")
            assert batch[0].queue == batch[1].queue
            assert {r.queue.queue_id for r in sent} == {0, 1, 2, 3}
            got: list[bytes] = []
            done = asyncio.Event()
            failures = {"n": 0}

            def handle(message) -> None:
                if message.body == b"m3" and failures["n"] < 2:
                    failures["n"] += 1
                    raise RuntimeError("transient")
                got.append(message.body)
                if len(got) == 22:
                    done.set()

            consumer = PushConsumer([env.ns], "cg", "orders", handle, long_poll_ms=500)
            await consumer.start()
            async with asyncio.timeout(20):
                await done.wait()
            await consumer.stop()
            assert sorted(got) == sorted([b"m%d" % i for i in range(20)] + [b"x", b"y"])
            assert failures["n"] == 2
            puller = PullConsumer([env.ns], "cg")
            total = 0
            for q in range(4):
                committed = await puller.committed(MessageQueue("orders", "g1", q))
                total += committed
            assert total == 22
            await puller.close()
            await producer.close()
    run(main())


def test_sync_wrapper_send_async_and_oneway(tmp_path) -> None:
    from ledgermq.client.sync import SyncProducer, SyncPullConsumer

    def blocking(ns: str) -> list[bytes]:
        with SyncProducer([ns]) as producer:
            producer.create_topic("s", queues=1)
            first = producer.send("s", b"sync", tags="a")
            later = producer.send_async("s", b"async")
            batch = producer.send_batch("s", [b"b1", b"b2"])
            producer.send_oneway("s", b"oneway")
            assert later.result(10).queue_offset == 1
            assert [r.queue_offset for r in batch] == [2, 3]
            assert first.msg_id.startswith("g1@")
        consumer = SyncPullConsumer([ns], "sg")
        mq = consumer.queues("s")[0]
        bodies: list[bytes] = []
        deadline = 200
        while len(bodies) < 5 and deadline:
            deadline -= 1
            result = consumer.pull(mq, len(bodies), 10, wait_ms=100)
            bodies += [m.body for m in result.messages]
        consumer.commit(mq, len(bodies))
        assert consumer.committed(mq) == len(bodies)
        consumer.close()
        return bodies

    async def run_it() -> None:
        async with Env(tmp_path) as env:
            bodies = await asyncio.to_thread(blocking, env.ns)
            assert bodies == [b"sync", b"async", b"b1", b"b2", b"oneway"]

    run(run_it())


def test_replicate_async_acknowledges_before_the_queue_offset_is_known(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path, replicate="async", flush="sync") as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            reply = await env.req(RequestCode.SEND_MESSAGES, {"messages": [msg("t", b"a")]})
            result = reply["results"][0]
            assert result["queue_offset"] is None and result["msg_id"].startswith("g1@")
            pulled: list[dict] = []
            for _ in range(200):
                pulled = (await env.req(RequestCode.PULL_MESSAGES, {
                    "topic": "t", "queue_id": 0, "offset": 0, "wait_ms": 50}))["messages"]
                if pulled:
                    break
            assert [m["msg_id"] for m in pulled] == [result["msg_id"]]
    run(main())


def test_pull_size_cap_and_tag_filter_never_skip_a_message(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "big", "queues": 1})
            body = b"z" * 60_000
            for n in range(12):  # 80 of 120 ~60 KB messages match: more than 4 MiB
                await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                    msg("big", body, tags="a" if (n * 10 + i) % 3 else "b", keys=str(n * 10 + i))
                    for i in range(10)]})
            seen: list[str] = []
            offset, answers = 0, 0
            while offset < 120:
                reply = await env.req(RequestCode.PULL_MESSAGES, {
                    "topic": "big", "queue_id": 0, "offset": offset, "max_messages": 256,
                    "tags": ["a"]})
                assert sum(len(m["body"]) for m in reply["messages"]) <= 4 << 20
                seen += [m["keys"] for m in reply["messages"]]
                assert reply["next_offset"] > offset
                offset, answers = reply["next_offset"], answers + 1
            assert answers >= 2
            assert seen == [str(k) for k in range(120) if k % 3]
            # One request carrying the same identity twice stores it once.
            reply = await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                msg("big", b"d", producer_id=3, sequence=1),
                msg("big", b"d", producer_id=3, sequence=1)]})
            first, second = reply["results"]
            assert first["msg_id"] == second["msg_id"] and second["duplicate"]
            ranges = await env.req(RequestCode.GET_QUEUE_OFFSETS, {"topic": "big", "queue_id": 0})
            assert ranges["max_offset"] == 121
    run(main())


def test_push_consumer_gives_up_after_max_reconsume_and_topic_delete(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            producer = Producer([env.ns])
            await producer.create_topic("p", queues=1)
            await env.wait_route("p")
            for body in (b"ok-1", b"poison", b"ok-2"):
                await producer.send("p", body, tags="t")
            attempts: list[int] = []
            given_up: list[tuple[bytes, str]] = []
            got: list[bytes] = []
            done = asyncio.Event()

            def handle(message) -> None:
                if message.body == b"poison":
                    attempts.append(message.reconsume_times)
                    raise ValueError("cannot handle")
                got.append(message.body)
                if message.body == b"ok-2":
                    done.set()

            consumer = PushConsumer([env.ns], "pg", "p", handle, tags="t||u",
                                    max_reconsume_times=2, long_poll_ms=200,
                                    on_give_up=lambda m, e: given_up.append((m.body, str(e))))
            await consumer.start()
            async with asyncio.timeout(20):
                await done.wait()
            await consumer.stop()
            assert got == [b"ok-1", b"ok-2"]  # order kept around the poison message
            assert attempts == [0, 1, 2]
            assert given_up == [(b"poison", "cannot handle")]
            assert consumer.given_up == 1
            # Deleting the topic: sends with auto-create off are refused, pulls too.
            await env.req(RequestCode.DELETE_TOPIC, {"topic": "p"})
            env.broker.config = env.broker.config.with_overrides(auto_create_topics=False)
            with pytest.raises(UnknownTopicError):
                await env.req(RequestCode.SEND_MESSAGES, {"messages": [msg("p", b"x")]})
            with pytest.raises(UnknownTopicError):
                await env.req(RequestCode.PULL_MESSAGES, {"topic": "p", "queue_id": 0,
                                                          "offset": 0})
            await producer.close()
    run(main())


def test_flush_interval_reaches_the_commitlog_flusher(tmp_path) -> None:
    # flush="async" with a one-minute interval (and no checkpoint forcing a
    # sync): half a second after a send nothing new is durable, where the
    # default 200 ms interval would have synced it; a 20 ms interval does.
    async def durable_gap(path, interval_ms: int) -> int:
        async with Env(path, flush="async", flush_interval_ms=interval_ms,
                       cq_checkpoint_interval_ms=60_000) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            await env.req(RequestCode.SEND_MESSAGES, {"messages": [msg("t", b"x")] * 10})
            await asyncio.sleep(0.5)
            log = env.broker.node.log
            return log.last_index - log.durable_index

    assert run(durable_gap(tmp_path / "slow", 60_000)) > 0
    assert run(durable_gap(tmp_path / "fast", 20)) == 0


# ---------------------------------------------------------------- a full disk
# A broker whose disk fills up fails loudly: it refuses writes with the reason,
# its status and metrics say so, and what it acknowledged stays readable. The
# disk is a real 1 MiB tmpfs (needs root): the ENOSPC comes from the kernel.


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "1m") as mount_point:
        yield mount_point


def test_a_full_disk_fails_the_node_loudly_and_loses_nothing_acknowledged(small_disk) -> None:
    async def main() -> None:
        async with Env(small_disk, segment_size_bytes=64 * 1024,
                       admin_listen="127.0.0.1:0") as env:
            producer = Producer([env.ns], retry_timeout=2.0)
            acked: list[bytes] = []
            refusal: Exception | None = None
            try:
                for i in range(5000):
                    body = b"%06d" % i + b"x" * 2000
                    try:
                        await producer.send("T", body)
                    except (LedgerMQError, OSError) as exc:
                        refusal = exc
                        break
                    acked.append(body)
            finally:
                await producer.close()
            assert refusal is not None and len(acked) > 10
            node = env.broker.node
            assert node.failed is not None or isinstance(refusal, DiskFullError)
            # Whatever the first refusal was, the node is failed now or at its
            # next write, and from then on every write is refused with why.
            with pytest.raises((ServiceUnavailableError, DiskFullError)):
                await env.req(RequestCode.SEND_MESSAGES, {"topic": "T", "messages": [
                    {"body": b"after"}]})
            if node.failed is None:
                with pytest.raises(ServiceUnavailableError, match="has failed"):
                    await env.req(RequestCode.SEND_MESSAGES, {"topic": "T", "messages": [
                        {"body": b"after"}]})
            assert node.failed is not None
            status = await env.req(RequestCode.BROKER_STATUS, None)
            assert "disk full" in str(status.get("raft", status).get("failed"))
            async with aiohttp.ClientSession() as http, \
                    http.get(f"{env.broker.admin.url}/metrics") as resp:
                text = await resp.text()
            assert 'ledgermq_node_failed{group="g1",node="1"} 1.0' in text
            # Everything acknowledged is still served.
            consumer = PullConsumer([env.ns], "g-check")
            try:
                seen: list[bytes] = []
                for mq in await consumer.queues("T"):
                    offset = 0
                    while True:
                        result = await consumer.pull(mq, offset, 64)
                        if not result.messages:
                            break
                        seen += [m.body for m in result.messages]
                        offset = result.next_offset
            finally:
                await consumer.close()
            assert set(acked) <= set(seen)

    loop.run(main())


# ---------------------------------------------------------------- rollback
# After a committed divergence (flush=async power cut) the broker sets the
# diverged tail aside and rebuilds from the log; see broker/rollback.py.


def test_a_requested_rollback_sets_the_tail_aside_and_rebuilds(tmp_path) -> None:
    from ledgermq.broker import rollback

    async def fill() -> dict[int, bytes]:
        async with Env(tmp_path) as env:
            producer = Producer([env.ns])
            try:
                for i in range(12):
                    await producer.send("T", b"m%02d" % i)
            finally:
                await producer.close()
            log_ = env.broker.node.log
            bodies = {}
            for entry in log_.read_entries(1, log_.last_index + 1):
                if entry.kind == 1:
                    bodies[entry.index] = entry.body
            return bodies

    bodies = loop.run(fill())
    cut_from = sorted(bodies)[-4]  # the last four message entries "diverged"
    rollback.request_rollback(str(tmp_path / "n1"), cut_from, "test: diverged at the leader")

    async def reopen() -> None:
        async with Env(tmp_path) as env:
            done = env.broker.rolled_back
            assert done is not None and done.from_index == cut_from
            assert done.kept_last_index == cut_from - 1
            assert not (tmp_path / "n1" / rollback.MARKER).exists()
            aside = tmp_path / "n1" / done.aside.rsplit("/", 1)[-1]
            assert (aside / "consumequeue").is_dir() and (aside / "hardstate").exists()
            assert any((aside / "commitlog").iterdir())
            consumer = PullConsumer([env.ns], "g-rollback")
            try:
                seen = []
                for mq in await consumer.queues("T"):
                    result = await consumer.pull(mq, 0, 64)
                    seen += [m.body for m in result.messages]
            finally:
                await consumer.close()
            assert sorted(seen) == [b"m%02d" % i for i in range(8)]

    loop.run(reopen())


def test_a_committed_divergence_asks_for_a_restart_only_when_rollback_is_allowed(
        tmp_path) -> None:
    from dledger.log import CommittedDivergence
    from ledgermq.broker import rollback

    async def main(flush: str) -> tuple[bool, bool]:
        async with Env(tmp_path / flush, flush=flush) as env:
            env.broker._on_node_failure(CommittedDivergence(5, 1, 2))
            marker = (tmp_path / flush / "n1" / rollback.MARKER).exists()
            return env.broker.restart_requested.is_set(), marker

    assert loop.run(main("async")) == (True, True)
    assert loop.run(main("sync")) == (False, False)  # flush=sync: stop, keep everything


def _metric_values(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets, from /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def test_each_observed_metric_moves_when_a_message_is_sent(tmp_path) -> None:
    """The runtime, its Flusher and the send path report to the metrics
    through typed observer hooks: each observed figure moves with one send."""
    observed = [
        "ledgermq_commitlog_append_seconds_count", "ledgermq_commitlog_append_entries_sum",
        "ledgermq_commitlog_fsync_seconds_count", "ledgermq_commitlog_fsync_batch_entries_sum",
        "ledgermq_raft_commit_seconds_count", "ledgermq_group_commit_batch_messages_sum",
        "ledgermq_requests_total", "ledgermq_request_seconds_count",
        # The send's answer starts a spin (busy_poll_us is on by default).
        "ledgermq_busy_poll_spins_total",
    ]

    async def main() -> None:
        async with Env(tmp_path, admin_listen="127.0.0.1:0") as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "m", "queues": 1})
            async with aiohttp.ClientSession() as http:
                async def scrape() -> dict[str, float]:
                    async with http.get(f"{env.broker.admin.url}/metrics") as resp:
                        return _metric_values(await resp.text())

                before = await scrape()
                await env.req(RequestCode.SEND_MESSAGES, {"messages": [
                    msg("m", b"one"), msg("m", b"two")]})
                after = await scrape()
            for name in observed:
                assert after.get(name, 0.0) > before.get(name, 0.0), name
            assert after["ledgermq_group_commit_batch_messages_sum"] - \
                before.get("ledgermq_group_commit_batch_messages_sum", 0.0) == 2

    run(main())


def test_a_test_can_inject_the_raft_runtime(tmp_path) -> None:
    """`Broker(config, runtime=...)` builds its replica with the factory given."""
    from dledger.runtime.node import RaftGroupNode

    built: list[RaftGroupNode] = []

    def runtime(config, apply, **kwargs) -> RaftGroupNode:
        node = RaftGroupNode(config, apply, **kwargs)
        built.append(node)
        return node

    async def main() -> None:
        broker = Broker(make_config(tmp_path), runtime=runtime)
        await broker.start()
        try:
            assert broker.node is built[0]
            assert await broker.node.wait_leader_ready(10)
        finally:
            await broker.stop()

    run(main())


@pytest.mark.parametrize("raft, expected", [
    ({}, (2, 4)),  # NodeConfig's defaults
    ({"leader_lost_grace_ticks": 0, "lost_leader_ticks": 7}, (0, 7)),  # the watch off
])
def test_the_leader_watch_is_configured_by_the_broker_config(tmp_path, raft, expected) -> None:
    async def main() -> None:
        broker = Broker(make_config(tmp_path, **raft))
        await broker.start()
        try:
            node = broker.node.config
            assert (node.leader_lost_grace_ticks, node.lost_leader_ticks) == expected
            assert node.election_config().lost_leader_ticks == expected[1]
        finally:
            await broker.stop()

    loop.run(main())
