"""The producer's send path against an in-process fake broker: what goes on
the wire (records, sequences, coalescing) and what comes back (SendResult)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NotLeaderError,
    ServiceUnavailableError,
)
from ledgermq.client import Message, MessageQueue, Producer, SendResult
from ledgermq.client.coalesce import SendCoalescer
from ledgermq.client.records import encode_record
from tests.ledgermq.client.fake import FakeBroker

pytestmark = pytest.mark.timeout(60)


def run(coro):
    return loop.run(coro)


def lose_first_answer(broker: FakeBroker) -> None:
    """The broker stores the first SEND_MESSAGES request but its answer is
    lost (the client sees SERVICE_UNAVAILABLE); later ones are answered."""
    original = broker._send
    answered = 0

    async def send(body: Any, conn: Any) -> Any:
        nonlocal answered
        reply = await original(body, conn)
        answered += 1
        if answered == 1:
            raise ServiceUnavailableError("answer lost")
        return reply

    broker.server.handlers[RequestCode.SEND_MESSAGES] = send


def check_results(broker: FakeBroker, results: list[SendResult]) -> None:
    """Every result names the record the broker stored for it."""
    by_id = {f"{broker.group}@{r.position:016X}": r for r in broker.records}
    for result in results:
        stored = by_id[result.msg_id]
        assert result.queue == MessageQueue(stored.topic, broker.group, stored.queue_id)
        assert result.queue_offset == stored.queue_offset
        assert not result.duplicate


def test_concurrent_sends_share_requests_and_get_their_own_results() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=3).start()
        broker.delay = 0.005
        producer = Producer([broker.address])
        try:
            bodies = [f"m{i}".encode() * (i % 7 + 1) for i in range(300)]
            results = await asyncio.gather(*(producer.send("t", b) for b in bodies))
            assert len(broker.records) == 300
            assert len(broker.requests) < 30  # coalesced
            check_results(broker, results)
            stored = {r.msg_id: r for r in results}
            by_id = {f"g1@{r.position:016X}": r for r in broker.records}
            for body, result in zip(bodies, results, strict=True):
                assert by_id[result.msg_id].body == body
            assert len(stored) == 300
            # round robin over every queue; sequences unique, from 1
            assert {r.queue.queue_id for r in results} == {0, 1, 2}
            assert sorted(r.sequence for r in broker.records) == list(range(1, 301))
            assert {r.producer_id for r in broker.records} == {producer.producer_id}
            assert {r.host for r in broker.records} == {producer.born_host}
            # queue offsets per queue are 0..n-1 without gaps or repeats
            for q in range(3):
                offsets = sorted(r.queue_offset for r in results if r.queue.queue_id == q)
                assert offsets == list(range(len(offsets)))
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_without_coalescing_every_send_is_its_own_request_all_in_flight() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=3).start()
        broker.delay = 0.05
        in_flight = high = 0
        inner = broker._send

        async def counting(body: Any, conn: Any) -> Any:
            nonlocal in_flight, high
            in_flight += 1
            high = max(high, in_flight)
            try:
                return await inner(body, conn)
            finally:
                in_flight -= 1

        broker.server.handlers[RequestCode.SEND_MESSAGES] = counting
        producer = Producer([broker.address], coalesce=False)
        try:
            results = await asyncio.gather(*(producer.send("t", b"m%d" % i) for i in range(40)))
            assert broker.requests == [1] * 40
            assert high == 40  # none waited for another's reply
            assert producer.coalescer.requests == 40
            check_results(broker, results)
            # send_batch is still one request of its messages.
            await producer.send_batch("t", [b"a", b"b", b"c"])
            assert broker.requests[-1] == 3
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_without_coalescing_retries_and_errors_take_the_coalescing_paths() -> None:
    """coalesce=False (or the kit's max_messages=1 and no in-flight limit):
    a send is its own request in its caller's task (`send_alone`); a lost
    answer, NOT_LEADER and a per-message refusal are handled as with
    coalescing: retried with the same identity, or raised to that caller."""
    async def main() -> None:
        follower = await FakeBroker().start()
        leader = await FakeBroker().start()
        def refuse(parsed):
            raise NotLeaderError("not leader", leader=leader.address)

        def too_large(parsed):
            if any(len(raw) > 1000 for _, _, raw in parsed):
                raise MessageTooLargeError("too large")

        follower.hook = refuse
        leader.hook = too_large
        lose_first_answer(leader)
        kit_style = Producer([follower.address])
        kit_style.coalescer.max_messages, kit_style.coalescer.max_inflight = 1, 1 << 30
        for producer in (Producer([follower.address], coalesce=False), kit_style):
            assert not producer.coalescer.merges
        producer = kit_style
        try:
            first = await producer.send("t", b"once", sharding_key="k")
            assert first.duplicate and producer.retries >= 1  # NOT_LEADER, then the lost answer
            assert not follower.records and len(leader.records) == 1
            out = await asyncio.gather(*(producer.send("t", b"x" * (2000 if i == 3 else 9))
                                         for i in range(8)), return_exceptions=True)
            assert isinstance(out[3], MessageTooLargeError)
            good = [r for i, r in enumerate(out) if i != 3]
            check_results(leader, good)
            assert len(leader.records) == 1 + 7
            assert {r.sequence for r in leader.records} == set(range(1, 10)) - {5}
            assert producer.coalescer.requests >= 9
        finally:
            await producer.close()
            await leader.close()
            await follower.close()
    run(main())


def test_send_batch_and_mixed_messages_in_one_request() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=2).start()
        broker.delay = 0.005
        producer = Producer([broker.address])
        try:
            messages = [b"a", Message(b"bb", tags="T", keys="K", properties={"p": "v"}),
                        "text", bytearray(b"raw")]
            batches = [producer.send_batch("t", messages) for _ in range(5)]
            singles = [producer.send("t", b"s", tags="x") for _ in range(5)]
            other = [producer.send("u", Message(b"m", flag=3)) for _ in range(5)]
            out = await asyncio.gather(*batches, *singles, *other)
            for results in out[:5]:
                assert len(results) == 4
                assert len({r.queue for r in results}) == 1
                offsets = [r.queue_offset for r in results]
                assert offsets == list(range(offsets[0], offsets[0] + 4))
                check_results(broker, results)
            check_results(broker, out[5:])
            by_id = {f"g1@{r.position:016X}": r for r in broker.records}
            rec = by_id[out[0][1].msg_id]
            assert (rec.body, rec.tags, rec.keys, rec.props) == (b"bb", "T", "K", b"p\x01v\x02")
            assert by_id[out[0][2].msg_id].body == b"text"
            assert by_id[out[0][3].msg_id].body == b"raw"
            assert by_id[out[5].msg_id].tags == "x"
            assert by_id[out[10].msg_id].flag == 3
            assert by_id[out[10].msg_id].topic == "u"
            # a batch's sequences are consecutive
            seqs = [by_id[r.msg_id].sequence for r in out[0]]
            assert seqs == list(range(seqs[0], seqs[0] + 4))
            assert await producer.send_batch("t", []) == []
            assert await producer.send_batch("t", iter(())) == []
            from_generator = await producer.send_batch("t", (b"g%d" % i for i in range(3)))
            check_results(broker, from_generator)
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_replicate_async_results_have_no_queue_offset() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        broker.replicate_async = True
        producer = Producer([broker.address])
        try:
            one = await producer.send("t", b"x")
            many = await producer.send_batch("t", [b"y", b"z"])
            assert one.queue_offset is None and all(r.queue_offset is None for r in many)
            assert one.msg_id == f"g1@{broker.records[0].position:016X}"
            assert [r.msg_id for r in many] == [f"g1@{r.position:016X}"
                                                 for r in broker.records[1:]]
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_retry_after_lost_answer_is_a_duplicate_with_the_original_location() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        producer = Producer([broker.address])
        lose_first_answer(broker)
        try:
            result = await producer.send("t", b"once", sharding_key="k")
            assert result.duplicate
            assert len(broker.records) == 1
            assert result.msg_id == f"g1@{broker.records[0].position:016X}"
            assert result.queue.queue_id == broker.records[0].queue_id
            assert result.queue_offset == 0
            assert producer.retries == 1
            batch = await producer.send_batch("t", [b"a", b"b"])
            assert not any(r.duplicate for r in batch)
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_not_leader_retries_at_the_named_leader_with_the_same_identity() -> None:
    async def main() -> None:
        follower = await FakeBroker().start()
        leader = await FakeBroker().start()

        def refuse(parsed):
            raise NotLeaderError("not leader", leader=leader.address)

        follower.hook = refuse
        producer = Producer([follower.address])  # routes name the follower as leader
        try:
            results = await asyncio.gather(*(producer.send("t", b"%d" % i) for i in range(20)))
            assert not follower.records
            assert len(leader.records) == 20
            check_results(leader, results)
            assert sorted(r.sequence for r in leader.records) == list(range(1, 21))
            # the hint sticks: the next sends go straight to the leader
            before = len(follower.requests)
            await producer.send("t", b"again")
            assert len(follower.requests) == before
        finally:
            await producer.close()
            await leader.close()
            await follower.close()
    run(main())


def test_sharding_key_pins_the_queue() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=8).start()
        producer = Producer([broker.address])
        try:
            for key in ("a", "b", "order-17"):
                results = [await producer.send("t", b"x", sharding_key=key) for _ in range(5)]
                results += await producer.send_batch("t", [b"y"] * 3, sharding_key=key)
                assert len({r.queue for r in results}) == 1
            pinned = MessageQueue("t", "g1", 5)
            assert (await producer.send("t", b"z", queue=pinned)).queue == pinned
            assert {r.queue for r in await producer.send_batch("t", [b"1", b"2"],
                                                                 queue=pinned)} == {pinned}
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_one_bad_message_fails_alone_and_the_others_are_stored() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=2).start()
        broker.delay = 0.01

        def too_large(parsed):
            if any(len(raw) > 1000 for _, _, raw in parsed):
                raise MessageTooLargeError("too large")

        broker.hook = too_large
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")  # route cached, a request in flight next
            sends = [producer.send("t", b"x" * (2000 if i == 7 else 10)) for i in range(20)]
            sends.append(producer.send_batch("t", [b"p", b"q", b"r"]))
            out = await asyncio.gather(*sends, return_exceptions=True)
            assert isinstance(out[7], MessageTooLargeError)
            good = [r for i, r in enumerate(out) if i not in (7, 20)] + out[20]
            assert all(isinstance(r, SendResult) for r in good)
            check_results(broker, good)
            assert len(broker.records) == 1 + 19 + 3
            assert broker.requests[1:] == [1] * 19 + [3]  # re-sent caller by caller
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_unencodable_message_fails_without_disturbing_concurrent_sends() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")

            async def bad() -> None:
                await producer.send_batch("t", [b"ok", Message(b"b", properties={"a\x01": "v"})])

            sends = [producer.send("t", b"%d" % i) for i in range(10)]
            results = await asyncio.gather(*sends[:5], bad(), *sends[5:],
                                           return_exceptions=True)
            assert isinstance(results[5], InvalidRequestError)
            good = results[:5] + results[6:]
            check_results(broker, good)
            assert sorted(r.body for r in broker.records[1:]) == sorted(b"%d" % i
                                                                        for i in range(10))
            with pytest.raises(InvalidRequestError):
                await producer.send("t", Message(b"x", tags="t" * 70000))
            # The field named, not struct's "ushort format requires ...", on
            # every encoding path: one send, a send with keys, a batch.
            with pytest.raises(InvalidRequestError, match="tags must be shorter than 65536"):
                await producer.send("t", b"x", tags="t" * 70000)
            with pytest.raises(InvalidRequestError, match="keys must be shorter than 65536"):
                await producer.send("t", b"x", keys="k" * 100000)
            with pytest.raises(InvalidRequestError, match="keys must be shorter than 65536"):
                await producer.send_batch("t", [b"ok", Message(b"b", keys="k" * 100000)])
            # A tag no subscription could select ("a||b" is the expression
            # for two tags), on the one-message path and in a batch; nothing
            # of the refused request reaches the broker.
            stored = len(broker.records)
            with pytest.raises(InvalidRequestError, match=r"tag 'a\|\|b' contains '\|'"):
                await producer.send("t", b"x", tags="a||b")
            with pytest.raises(InvalidRequestError, match=r"contains '\|'"):
                await producer.send_batch("t", [b"ok", Message(b"b", tags="x|")])
            assert len(broker.records) == stored
            assert (await producer.send("t", b"x", tags="a")).msg_id
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_cancelled_send_does_not_cancel_the_others_in_its_request() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        broker.delay = 0.05
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")
            tasks = [asyncio.create_task(producer.send("t", b"%d" % i)) for i in range(10)]
            await asyncio.sleep(0.01)
            tasks[3].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(done[3], asyncio.CancelledError)
            check_results(broker, [r for i, r in enumerate(done) if i != 3])
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_lone_send_goes_out_in_its_callers_task_and_concurrent_ones_still_merge() -> None:
    """With merging on, a send that finds nothing queued or in flight waits
    one loop pass for company; alone then, it is sent from its caller's task
    (no task of the coalescer's); sends that come together share a request."""
    async def main() -> None:
        broker = await FakeBroker(queues=2).start()
        producer = Producer([broker.address])
        tasks_seen: list[int] = []
        broker.hook = lambda parsed: tasks_seen.append(len(producer.coalescer._tasks))
        try:
            assert producer.coalescer.merges
            await producer.send("t", b"warm")  # the route is looked up and cached
            lone = [await producer.send("t", b"one %d" % i) for i in range(5)]
            assert broker.requests[1:] == [1] * 5 and tasks_seen[1:] == [0] * 5
            check_results(broker, lone)
            together = await asyncio.gather(*(producer.send("t", b"m%d" % i) for i in range(40)))
            assert broker.requests[6:] == [40]  # the first waited one pass for the rest
            assert tasks_seen[6:] == [1]
            check_results(broker, together)
            assert sorted(r.sequence for r in broker.records) == list(range(1, 47))
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_send_cancelled_while_it_waits_for_company_strands_nobody() -> None:
    """The send that opened a request is cancelled during its one pass: the
    sends that joined it still go, and are answered."""
    async def main() -> None:
        broker = await FakeBroker().start()
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")
            tasks = [asyncio.create_task(producer.send("t", b"%d" % i)) for i in range(5)]
            await asyncio.sleep(0)  # the first has opened the request, the rest joined
            tasks[0].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(done[0], asyncio.CancelledError)
            check_results(broker, done[1:])
            # The cancelled caller's record had gone into the request: it is
            # stored, as a cancelled send's record in a merged request always was.
            assert broker.requests == [1, 5]
            # Later sends find the address idle again.
            assert (await producer.send("t", b"after")).queue_offset is not None
            assert broker.requests[-1] == 1
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_send_async_oneway_and_not_idempotent() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        producer = Producer([broker.address], idempotent=False)
        try:
            got = []
            task = producer.send_async("t", b"a", callback=lambda r, e: got.append((r, e)))
            result = await task
            await asyncio.sleep(0)
            assert got == [(result, None)]
            await producer.send_oneway("t", b"b")
            for _ in range(100):
                if len(broker.records) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [r.body for r in broker.records] == [b"a", b"b"]
            assert {(r.producer_id, r.sequence) for r in broker.records} == {(0, 0)}
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_coalescer_submit_with_records_of_several_queues() -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=4).start()
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")  # connection and route
            coalescer = SendCoalescer(producer._send_request)
            keys = [("t", 1), ("t", 1), ("t", 2), ("u", 1), ("t", 1)]
            records = [encode_record(t.encode(), q, b"%d" % k, b"", b"", b"h:0", b"", 0,
                                      1_700_000_000_000, 0, 0)
                       for k, (t, q) in enumerate(keys)]
            first, second = await asyncio.gather(coalescer.submit(broker.address, "g1", records,
                                                                  keys),
                                                 coalescer.submit(broker.address, "g1",
                                                                  records[:2], keys[:2]))
            assert coalescer.requests == 1
            by_id = {f"g1@{r.position:016X}": r for r in broker.records}
            for (msg_id, queue_id, offset, dup), (topic, q) in zip(first + second,
                                                                   keys + keys[:2],
                                                                   strict=True):
                rec = by_id[msg_id]
                assert (rec.topic, rec.queue_id, rec.queue_offset) == (topic, q, offset)
                assert queue_id == q and not dup
            assert [by_id[r[0]].body for r in first] == [b"0", b"1", b"2", b"3", b"4"]
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_stored_result_behaves_like_the_dataclass_it_is() -> None:
    import copy
    import dataclasses
    import pickle

    from ledgermq.client.model import stored_result

    mq = MessageQueue("t", "g1", 3)
    eager = SendResult("g1@00000000000004D2", mq, 7)
    assert pickle.loads(pickle.dumps(stored_result("g1", 1234, mq, 7))) == eager
    assert copy.copy(stored_result("g1", 1234, mq, 7)) == eager
    assert repr(stored_result("g1", 1234, mq, 7)) == repr(eager)
    assert hash(stored_result("g1", 1234, mq, 7)) == hash(eager)
    for lazy in (stored_result("g1", 1234, mq, 7), stored_result("g1", 1234, mq, 7)):
        assert lazy == eager and hash(lazy) == hash(eager)
        assert dataclasses.asdict(lazy) == dataclasses.asdict(eager)
        assert dataclasses.replace(lazy, queue_offset=8).queue_offset == 8
        assert lazy.msg_id == eager.msg_id and not lazy.duplicate
    with pytest.raises(AttributeError):
        eager.nothing  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        stored_result("g1", 1, mq, 0).msg_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize("idempotent", [True, False])
def test_batches_of_one_body_size_and_of_mixed_sizes(idempotent: bool) -> None:
    async def main() -> None:
        broker = await FakeBroker(queues=2).start()
        broker.delay = 0.002
        producer = Producer([broker.address], idempotent=idempotent)
        try:
            same = [b"%04d" % i for i in range(50)]
            mixed = [b"a" * (i % 5) for i in range(50)]  # empty bodies too
            out = await asyncio.gather(producer.send_batch("t", same),
                                       producer.send_batch("t", mixed),
                                       producer.send_batch("t", [b"only"]),
                                       producer.send("t", b"single"))
            by_id = {f"g1@{r.position:016X}": r for r in broker.records}
            for bodies, results in zip((same, mixed, [b"only"]), out, strict=False):
                check_results(broker, results)
                assert [by_id[r.msg_id].body for r in results] == bodies
                seqs = [by_id[r.msg_id].sequence for r in results]
                if idempotent:
                    assert seqs == list(range(seqs[0], seqs[0] + len(bodies)))
                else:
                    assert set(seqs) == {0}
            seqs = sorted(r.sequence for r in broker.records)
            assert seqs == (list(range(1, 103)) if idempotent else [0] * 102)
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_retried_batch_keeps_its_sequences() -> None:
    async def main() -> None:
        broker = await FakeBroker().start()
        producer = Producer([broker.address])
        original = broker._send
        lost = []

        async def lose_first_answer(body, conn):
            reply = await original(body, conn)
            if not lost:
                lost.append(reply)
                raise ServiceUnavailableError("answer lost")
            return reply

        try:
            await producer.send("t", b"warm")
            broker.server.handlers[200] = lose_first_answer
            results = await producer.send_batch("t", [b"x" * 10] * 20)
            assert all(r.duplicate for r in results)
            assert len(broker.records) == 21
            check = {f"g1@{r.position:016X}": r for r in broker.records}
            assert [check[r.msg_id].sequence for r in results] == list(range(2, 22))
            assert [r.queue_offset for r in results] == [check[r.msg_id].queue_offset
                                                         for r in results]
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_send_waiting_for_a_leader_polls_at_a_fixed_short_interval() -> None:
    """No leader for a while (every answer NOT_LEADER without a hint): the
    retries go out every ~10 ms, not at a doubling interval, and the route is
    asked of the NameServer again at most every 0.25 s, not on every retry."""
    async def main() -> None:
        broker = await FakeBroker().start()
        attempts: list[float] = []
        routes = 0
        route = broker._route

        async def count_routes(body: Any, conn: Any) -> Any:
            nonlocal routes
            routes += 1
            return await route(body, conn)

        def no_leader_yet(parsed: Any) -> None:
            attempts.append(time.monotonic())
            if attempts[-1] - attempts[0] < 0.6:
                raise NotLeaderError("electing", leader=None)

        broker.server.handlers[RequestCode.GET_ROUTE] = count_routes
        producer = Producer([broker.address])
        try:
            await producer.send("t", b"warm")
            routes = 0
            broker.hook = no_leader_yet
            started = time.monotonic()
            result = await producer.send("t", b"after the election")
            waited = time.monotonic() - started
            assert result.msg_id is not None and 0.6 <= waited < 0.75
            gaps = [b - a for a, b in itertools.pairwise(attempts)]
            # ~10 ms each plus a round trip; a doubling to 40 ms would put
            # the median near 40 ms.
            assert len(attempts) > 20 and statistics.median(gaps) < 0.025, gaps
            assert routes <= 4, routes  # about one per 0.25 s
        finally:
            await producer.close()
            await broker.close()
    run(main())


def test_a_leader_that_failed_before_the_send_is_trusted_when_a_node_names_it() -> None:
    """A node killed earlier, restarted and since elected: its old failure
    must not hold the SDK back (its address stayed suspect for 2 s, and the
    sends polled the follower naming it until then)."""
    async def main() -> None:
        follower = await FakeBroker().start()
        old = await FakeBroker().start()
        address = old.address
        await old.close()  # the leader dies ...
        producer = Producer([follower.address])
        leader = FakeBroker()
        try:
            with pytest.raises(OSError):
                await producer.cluster.request(address, RequestCode.SEND_MESSAGES, {})
            assert producer.cluster.is_suspect(address)
            # ... and comes back at the same address, elected.
            host, port = await leader.server.start(*address.rsplit(":", 1))
            leader.address = f"{host}:{port}"
            assert leader.address == address

            asked: list[int] = []

            def refuse(parsed: Any) -> None:
                asked.append(1)
                raise NotLeaderError("follower", leader=address)

            follower.hook = refuse
            await producer.send("t", b"to the new leader")
            assert len(leader.records) == 1
            # Asked once (it named the leader), not polled every 10 ms until
            # the 2 s suspicion ended.
            assert len(asked) == 1, len(asked)
        finally:
            await producer.close()
            await leader.close()
            await follower.close()
    run(main())
