"""A send that reaches a node during an election is held (`write_hold_ms`)
until the node knows the new leader, or takes it once it leads and has
applied its first entry: the client learns of the new leader when the node
does, instead of polling through the election."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dledger.runtime.node import RaftGroupNode, SoftStateInfo
from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import NotLeaderError, ServiceUnavailableError
from ledgermq.base.ports import free_port
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.server import Broker
from ledgermq.wire import RpcClient

pytestmark = pytest.mark.timeout(60)


class Steered(RaftGroupNode):
    """The real runtime, whose role, leader and readiness a test can pin (as an
    election would leave them) and then release, telling the broker."""

    def __init__(self, config: Any, apply: Any, *, on_soft_state: Any, **kwargs: Any) -> None:
        super().__init__(config, apply, on_soft_state=on_soft_state, **kwargs)
        self.tell = on_soft_state
        self.pinned: tuple[str, int, bool] | None = None

    @property
    def role(self) -> str:
        return self.pinned[0] if self.pinned else super().role

    @property
    def leader_id(self) -> int:
        return self.pinned[1] if self.pinned else super().leader_id

    @property
    def leader_ready(self) -> bool:
        return self.pinned[2] if self.pinned else super().leader_ready

    def change(self, pinned: tuple[str, int, bool] | None) -> None:
        self.pinned = pinned
        self.tell(SoftStateInfo(self.role, self.leader_id, self.term))
        self._notify_state()  # wakes wait_leader_ready


def _config(tmp_path: Any, nodes: int, hold_ms: int) -> BrokerConfig:
    peers = {n: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0" if n == 1 else f"10.0.0.{n}:1")
             for n in range(1, nodes + 1)}
    return BrokerConfig(group="g1", node_id=1, data_dir=str(tmp_path / "n1"), peers=peers,
                        segment_size_bytes=1 << 20, tick_ms=10, write_hold_ms=hold_ms,
                        namesrv_register_interval_ms=100)


async def _started(config: BrokerConfig) -> tuple[Broker, Steered, RpcClient]:
    nodes: list[Steered] = []

    def runtime(*args: Any, **kwargs: Any) -> Steered:
        nodes.append(Steered(*args, **kwargs))
        return nodes[0]

    broker = Broker(config, runtime=runtime)
    host, port = await broker.start()
    client = await RpcClient.connect(host, port)
    return broker, nodes[0], client


SEND = {"messages": [{"topic": "t", "body": b"x"}]}


@pytest.mark.parametrize("hold_ms", [0, 300])
def test_a_node_without_a_leader_holds_a_send_then_refuses_it(tmp_path: Any,
                                                               hold_ms: int) -> None:
    """Two nodes, the other one down: no leader ever. The send waits out the
    hold (none: at once) and is refused naming no leader."""
    async def main() -> None:
        broker, _, client = await _started(_config(tmp_path, 2, hold_ms))
        try:
            started = time.monotonic()
            with pytest.raises(NotLeaderError) as info:
                await client.request(RequestCode.SEND_MESSAGES, SEND, timeout=5)
            waited = time.monotonic() - started
            assert info.value.leader is None
            # The hold is measured on the loop's clock, which uvloop (libuv)
            # keeps in whole milliseconds and caches per iteration: it may end
            # up to ~2 ms before this process's monotonic clock says it should.
            assert hold_ms / 1000 - 0.002 <= waited < hold_ms / 1000 + 0.25
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())


def test_a_held_send_is_answered_with_the_leader_as_soon_as_the_node_knows_it(
        tmp_path: Any) -> None:
    async def main() -> None:
        broker, node, client = await _started(_config(tmp_path, 2, 5000))
        try:
            node.change(("candidate", 0, False))
            request = asyncio.ensure_future(
                client.request(RequestCode.SEND_MESSAGES, SEND, timeout=10))
            await asyncio.sleep(0.2)
            assert not request.done()  # held, not refused
            changed = time.monotonic()
            node.change(("follower", 2, False))
            with pytest.raises(NotLeaderError) as info:
                await request
            assert time.monotonic() - changed < 0.5
            assert info.value.leader == "10.0.0.2:1"
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())


def test_a_new_leader_holds_a_send_until_its_first_entry_is_applied_then_takes_it(
        tmp_path: Any) -> None:
    async def main() -> None:
        broker, node, client = await _started(_config(tmp_path, 1, 5000))
        try:
            assert await node.wait_leader_ready(10)
            node.change(("leader", 1, False))  # elected, first entry not applied yet
            request = asyncio.ensure_future(
                client.request(RequestCode.SEND_MESSAGES, SEND, timeout=10))
            await asyncio.sleep(0.2)
            assert not request.done()
            node.change(None)  # ready
            async with asyncio.timeout(2):
                reply = await request
            assert reply["results"][0]["msg_id"]
            # A failed node refuses at once: nothing to wait for.
            node.change(("leader", 1, False))
            node.failed = RuntimeError("disk gone")
            started = time.monotonic()
            with pytest.raises(ServiceUnavailableError):
                await client.request(RequestCode.SEND_MESSAGES, SEND, timeout=10)
            assert time.monotonic() - started < 0.5
            node.failed = None
            node.change(None)
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())
