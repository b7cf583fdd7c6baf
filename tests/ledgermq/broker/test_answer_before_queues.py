"""A send is answered before the leader's ConsumeQueue writes, and a pull
sent on that answer still finds the message: three brokers in one process
on 127.0.0.1 (real Raft and client ports).

The broker's apply leaves its queue writes for after the pass's answers
(RaftGroupNode's ApplyRest, Broker._apply_rest), so that the client goes on
while the leader indexes what it sent. A one-node group answers after them
as before: its commit happens inside the send's own handler, before the
answer exists."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.client.records import decode_reply, encode_record
from ledgermq.wire import RpcClient
from tests.node_harness import wait_until

pytestmark = pytest.mark.timeout(120)


def _peeked(fd: int) -> int:
    """Bytes waiting in socket `fd`, left there."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        try:
            return len(sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            return 0


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_the_leader_answers_a_send_before_its_queue_writes(tmp_path: Path, flush: str) -> None:
    peers = {n: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}") for n in (1, 2, 3)}

    async def main() -> None:
        brokers: dict[int, Broker] = {}
        try:
            for n in peers:
                brokers[n] = Broker(BrokerConfig(
                    group="g1", node_id=n, data_dir=str(tmp_path / f"n{n}"), peers=peers,
                    segment_size_bytes=1 << 20, tick_ms=10, flush=flush))
                await brokers[n].start()
            leader = await wait_until(lambda: next(
                (b for b in brokers.values() if b.node.role == "leader" and b.node.leader_ready),
                None), 20.0, "a ready leader")
            host, port = leader.address
            client = await RpcClient.connect(host, port)
            try:
                await client.request(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
                fd = client._conn.transport.get_extra_info("socket").fileno()
                waiting: list[int] = []
                dispatch = leader.cq.dispatch

                def watched(*args: Any, **kwargs: Any) -> None:
                    waiting.append(_peeked(fd))
                    dispatch(*args, **kwargs)

                leader.cq.dispatch = watched  # type: ignore[method-assign]
                for k in range(10):
                    # The SDK's record form: the per-message path (a Reply, no task).
                    record = encode_record(b"t", 0, b"m%d" % k, b"", b"", b"", b"", 0, 0, 7, k)
                    reply = await client.request(RequestCode.SEND_MESSAGES,
                                                 {"records": record, "count": 1})
                    assert decode_reply(reply, "g1", [record], [("t", 0)])[0][2] == k
                    pulled = await client.request(RequestCode.PULL_MESSAGES,
                                                  {"topic": "t", "queue_id": 0, "offset": k})
                    assert [m["body"] for m in pulled["messages"]] == [b"m%d" % k]
                # Each send's queue writes began with its answer in the client's socket.
                assert len(waiting) == 10 and all(waiting), waiting
            finally:
                await client.close()
        finally:
            for broker in brokers.values():
                await broker.stop()

    loop.run(main())
