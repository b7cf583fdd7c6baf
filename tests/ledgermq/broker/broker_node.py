"""A one-node broker group for in-process tests that restart it: `Node` starts
and stops it as an async context manager, on the same data directory and
Raft port each time."""

from __future__ import annotations

from pathlib import Path

from ledgermq.base.codes import RequestCode
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.wire import RpcClient


class Node:
    """One single-node broker group on `tmp_path/n1`, started and stopped
    as a context manager; the same `raft` port each time it is reopened."""

    def __init__(self, tmp_path: Path, **overrides: object) -> None:
        values: dict[str, object] = dict(
            group="g1", node_id=1, data_dir=str(tmp_path / "n1"),
            peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")},
            segment_size_bytes=1 << 20, message_size_bytes_max=64 * 1024, tick_ms=10)
        values.update(overrides)
        self.config = BrokerConfig(**values)  # type: ignore[arg-type]

    async def __aenter__(self) -> Node:
        self.broker = Broker(self.config)
        try:
            host, port = await self.broker.start()
        except BaseException:
            await self.broker.stop()
            raise
        await self.broker.node.wait_leader_ready(10)
        self.client = await RpcClient.connect(host, port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.broker.stop()

    async def req(self, code: int, body: object) -> dict:
        return await self.client.request(code, body)

    async def send(self, topic: str, body: bytes, **fields: object) -> dict:
        reply = await self.req(RequestCode.SEND_MESSAGES,
                               {"messages": [{"topic": topic, "body": body, **fields}]})
        return reply["results"][0]

    async def bodies(self, topic: str, queue_id: int, offset: int = 0) -> list[bytes]:
        reply = await self.req(RequestCode.PULL_MESSAGES, {
            "topic": topic, "queue_id": queue_id, "offset": offset, "max_messages": 256})
        return [m["body"] for m in reply["messages"]]

    def recovery(self) -> dict:
        return self.broker.status()["recovery"]
