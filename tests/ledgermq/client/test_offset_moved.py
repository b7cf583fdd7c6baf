"""The consumer's answer to OFFSET_MOVED (a pull below the first message a
queue still holds): continue from it and count it ("earliest", the default),
or raise ("error"); brokers that predate the code answered such a pull
OFFSET_OUT_OF_RANGE, which means the same when the offset is below the range.

The broker side of the same exchange runs on real brokers in
tests/ledgermq/broker/test_retention.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import OffsetMovedError, OffsetOutOfRangeError
from ledgermq.client import PullConsumer
from ledgermq.client.model import MessageQueue
from ledgermq.wire.rpc import RpcServer

pytestmark = pytest.mark.timeout(30)


class PullingBroker:
    """NameServer and broker in one: one topic, queue 0 holds offsets
    [first, end) (retention deleted the ones below `first`)."""

    def __init__(self, first: int, end: int, legacy: bool = False) -> None:
        self.first, self.end, self.legacy = first, end, legacy
        self.pulls: list[int] = []
        self.server = RpcServer("fake", {RequestCode.GET_ROUTE: self._route,
                                         RequestCode.PULL_MESSAGES: self._pull})
        self.address = ""

    async def __aenter__(self) -> PullingBroker:
        host, port = await self.server.start("127.0.0.1", 0)
        self.address = f"{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close(grace=0.1)

    async def _route(self, body: Any, conn: Any) -> Any:
        return {"topic": body["topic"], "groups": [{
            "cluster": "c", "group": "g1", "queues": 1, "perm": 6,
            "leader": {"node_id": "n1", "address": self.address, "role": "leader", "term": 1},
            "nodes": [{"node_id": "n1", "address": self.address}]}]}

    async def _pull(self, body: Any, conn: Any) -> Any:
        offset = body["offset"]
        self.pulls.append(offset)
        lo, hi = self.first, self.end
        if offset < lo:
            if self.legacy:
                raise OffsetOutOfRangeError("out of range",
                                            data={"min_offset": lo, "max_offset": hi})
            raise OffsetMovedError("deleted by retention",
                                   data={"min_offset": lo, "max_offset": hi,
                                         "requested": offset})
        upto = min(hi, offset + body["max_messages"])
        return {"messages": [{"msg_id": f"g1@{o:016X}", "topic": "T", "queue_id": 0,
                              "queue_offset": o, "body": b"m%d" % o}
                             for o in range(offset, upto)],
                "next_offset": upto, "min_offset": lo, "max_offset": hi}


MQ = MessageQueue("T", "g1", 0)


@pytest.mark.parametrize("legacy", [False, True])
def test_earliest_continues_from_the_oldest_retained_message(legacy, caplog) -> None:
    async def main() -> None:
        async with PullingBroker(first=40, end=50, legacy=legacy) as broker:
            consumer = PullConsumer([broker.address], "cg")
            try:
                with caplog.at_level(logging.WARNING, logger="ledgermq.client.consumer"):
                    result = await consumer.pull(MQ, 3, 4)
                assert [m.queue_offset for m in result.messages] == [40, 41, 42, 43]
                assert result.moved_from == 3 and result.next_offset == 44
                assert consumer.offsets_moved == 1
                assert broker.pulls == [3, 40]
                assert "continuing from the oldest retained message, offset 40" in caplog.text
                # A pull inside the range is not "moved".
                again = await consumer.pull(MQ, 44, 4)
                assert again.moved_from is None and consumer.offsets_moved == 1
            finally:
                await consumer.close()

    loop.run(main())


@pytest.mark.parametrize("legacy", [False, True])
def test_error_raises_with_where_the_queue_starts_now(legacy) -> None:
    async def main() -> None:
        async with PullingBroker(first=40, end=50, legacy=legacy) as broker:
            consumer = PullConsumer([broker.address], "cg", on_offset_moved="error")
            try:
                with pytest.raises(OffsetMovedError) as info:
                    await consumer.pull(MQ, 3, 4)
                assert info.value.min_offset == 40 and info.value.requested == 3
                assert consumer.offsets_moved == 1 and broker.pulls == [3]
            finally:
                await consumer.close()

    loop.run(main())


def test_an_offset_beyond_the_end_is_not_moved() -> None:
    async def main() -> None:
        async with PullingBroker(first=0, end=5) as broker:

            async def beyond(body: Any, conn: Any) -> Any:
                raise OffsetOutOfRangeError("beyond", data={"min_offset": 0, "max_offset": 5})

            broker.server.handlers[RequestCode.PULL_MESSAGES] = beyond
            consumer = PullConsumer([broker.address], "cg")
            try:
                with pytest.raises(OffsetOutOfRangeError):
                    await consumer.pull(MQ, 9, 4)
                assert consumer.offsets_moved == 0
            finally:
                await consumer.close()

    loop.run(main())


def test_a_bad_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="on_offset_moved"):
        PullConsumer(["127.0.0.1:1"], "cg", on_offset_moved="latest")
