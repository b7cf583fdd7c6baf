"""The workload records every "moved forward" jump its readers make: the
consumers' (the client continues by itself; the workload's wrapper records
`moved_from` and where the pull continued) and the drain's (it continues
itself from the broker's `min_offset`). Real client PullConsumers, whose
wire call (`_pull_once`) is replaced by a scripted queue."""

from __future__ import annotations

import asyncio
import time

from chaos.checker import check
from chaos.history import History
from chaos.workload import DRAIN_PROCESS, Workload, WorkloadSpec, body_of
from ledgermq.base.errors import OffsetMovedError
from ledgermq.client import PullConsumer
from ledgermq.client.model import MessageQueue, PullResult, ReceivedMessage

MQ = MessageQueue("chaos", "g1", 0)


def message(offset: int) -> ReceivedMessage:
    return ReceivedMessage(msg_id=f"m{offset}", topic=MQ.topic, queue_id=MQ.queue_id,
                           queue_offset=offset, body=body_of(offset), tags="", keys="",
                           properties={}, born_timestamp_ms=0, store_timestamp_ms=0,
                           producer_id=0, sequence=0, reconsume_times=0, group=MQ.group)


def scripted(puller: PullConsumer, first: int, end: int) -> list[int]:
    """The queue holds [first, end): below `first` is answered OFFSET_MOVED.
    Returns the offsets the puller asked for."""
    asked: list[int] = []

    async def pull_once(mq, offset, max_messages, tags, wait_ms):
        asked.append(offset)
        if offset < first:
            raise OffsetMovedError("deleted", data={"min_offset": first, "max_offset": end,
                                                    "requested": offset})
        got = [message(o) for o in range(offset, min(end, offset + max_messages))]
        return PullResult(got, offset + len(got), first, end)

    puller._pull_once = pull_once  # type: ignore[method-assign]
    return asked


def test_a_consumer_pull_moved_forward_is_recorded_where_the_client_continued() -> None:
    history = History()
    workload = Workload(WorkloadSpec(), "127.0.0.1:9", history)
    puller = PullConsumer(["127.0.0.1:9"], "chaos-consumers")
    asked = scripted(puller, first=7, end=9)
    workload._record_moves(puller, 1000)

    async def go() -> PullResult:
        try:
            return await puller.pull(MQ, 3, 32)
        finally:
            await puller.close()

    result = asyncio.run(go())
    assert asked == [3, 7] and result.moved_from == 3  # the client's own behaviour, unchanged
    assert [m.queue_offset for m in result.messages] == [7, 8]
    moved = [op for op in history.ops if op.f == "moved"]
    assert len(moved) == 1 and moved[0].process == 1000 and moved[0].type == "ok"
    assert moved[0].value == {"topic": "chaos", "group": "g1", "queue": 0, "from": 3, "to": 7,
                              "min_offset": 7, "drain": False}
    assert workload.moves == 1


def test_the_drain_records_its_jump_and_continues_from_min_offset() -> None:
    history = History()
    workload = Workload(WorkloadSpec(), "127.0.0.1:9", history)
    puller = PullConsumer(["127.0.0.1:9"], "chaos-drain", on_offset_moved="error")
    asked = scripted(puller, first=5, end=8)
    next_offset: dict[MessageQueue, int] = {}

    async def go() -> int:
        try:
            return await workload._drain_queue(puller, MQ, next_offset, time.monotonic() + 10)
        finally:
            await puller.close()

    assert asyncio.run(go()) == 3
    assert asked[:2] == [0, 5] and next_offset[MQ] == 8
    moved, poll = [op for op in history.ops if op.f in ("moved", "poll")][:2]
    assert moved.process == DRAIN_PROCESS and moved.value["drain"] is True
    assert (moved.value["from"], moved.value["to"]) == (0, 5)
    assert [m["offset"] for m in poll.value["messages"]] == [5, 6, 7]
    # What the checker makes of it: nothing skipped, the first five expired.
    for offset in range(8):
        invoke = {"topic": "chaos", "value": offset}
        history.record(1, "invoke", "send", invoke)
        history.record(1, "ok", "send", dict(invoke, group="g1", queue=0, offset=offset))
    ops = sorted(history.ops, key=lambda op: (op.f != "send", op.index))
    for i, op in enumerate(ops):
        op.index = i
    result = check(ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == 5 and result["counts"]["lost"] == 0

