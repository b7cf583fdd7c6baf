"""An in-process fake NameServer + broker for client tests: one RpcServer that
answers GET_ROUTE / GET_CLUSTER / CREATE_TOPIC and SEND_MESSAGES (records form),
decoding every record it receives so tests can check what the client sent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledgermq.base.codes import RequestCode
from ledgermq.client.records import HEAD, HEAD_SIZE
from ledgermq.wire.rpc import RpcServer


@dataclass
class Record:
    topic: str
    queue_id: int
    body: bytes
    tags: str
    keys: str
    host: str
    props: bytes
    flag: int
    born_ms: int
    producer_id: int
    sequence: int
    position: int  # physical offset the fake stored it at
    queue_offset: int


def parse(blob: bytes) -> list[tuple[int, tuple[Any, ...], bytes]]:
    """(start, head fields, record bytes) per record."""
    out = []
    pos = 0
    while pos < len(blob):
        head = HEAD.unpack_from(blob, pos)
        size = head[0]
        assert size == HEAD_SIZE + sum(head[9:15]), "size does not match the field lengths"
        assert head[3] == head[5] == head[8] == 0, "sys flag, store time, reconsume times"
        assert head[4] > 1_600_000_000_000, "born timestamp"
        out.append((pos, head, bytes(blob[pos:pos + size])))
        pos += size
    assert pos == len(blob), "truncated record"
    return out


class FakeBroker:
    def __init__(self, group: str = "g1", queues: int = 4) -> None:
        self.group = group
        self.queues = queues
        self.server = RpcServer("fake", {
            RequestCode.GET_ROUTE: self._route, RequestCode.GET_CLUSTER: self._cluster,
            RequestCode.CREATE_TOPIC: self._create, RequestCode.SEND_MESSAGES: self._send})
        self.address = ""
        self.leader: str | None = None  # the leader named in routes; default: self
        self.records: list[Record] = []
        self.requests: list[int] = []  # record count per SEND_MESSAGES request
        self.stored = 0
        self.offsets: dict[tuple[str, int], int] = {}
        self.seen: dict[tuple[int, int], Record] = {}
        self.delay = 0.0
        self.replicate_async = False
        # called with the request's parsed records before storing; may raise
        self.hook: Callable[[list[tuple[int, tuple[Any, ...], bytes]]], None] | None = None

    async def start(self) -> FakeBroker:
        host, port = await self.server.start("127.0.0.1", 0)
        self.address = f"{host}:{port}"
        return self

    async def close(self) -> None:
        await self.server.close(grace=0.1)

    async def _route(self, body: Any, conn: Any) -> Any:
        leader = self.leader or self.address
        return {"topic": body["topic"], "groups": [{
            "cluster": "c", "group": self.group, "queues": self.queues, "perm": 6,
            "leader": {"node_id": "n1", "address": leader, "role": "leader", "term": 1},
            "nodes": [{"node_id": "n1", "address": leader}]}]}

    async def _cluster(self, body: Any, conn: Any) -> Any:
        return {"clusters": {"c": [self.group]}, "groups": {self.group: {
            "leader": "n1", "nodes": [{"node_id": "n1", "address": self.address}]}}}

    async def _create(self, body: Any, conn: Any) -> Any:
        return {}

    async def _send(self, body: Any, conn: Any) -> Any:
        blob = body["records"]
        parsed = parse(blob)
        assert body.get("count", len(parsed)) == len(parsed)
        if self.hook is not None:
            self.hook(parsed)
        if self.delay:
            await asyncio.sleep(self.delay)
        self.requests.append(len(parsed))
        base = self.stored
        firsts: dict[tuple[str, int], int] = {}
        results = []
        duplicate = False
        for start, head, raw in parsed:
            lt, ltag, lk, lh, lp, lb = head[9:15]
            at = HEAD_SIZE
            fields = []
            for n in (lt, ltag, lk, lh, lp, lb):
                fields.append(raw[at:at + n])
                at += n
            topic = fields[0].decode()
            ident = (head[6], head[7])
            if head[6] and ident in self.seen:
                old = self.seen[ident]
                duplicate = True
                results.append({"msg_id": f"{self.group}@{old.position:016X}",
                                "queue_id": old.queue_id, "queue_offset": old.queue_offset,
                                "duplicate": True})
                continue
            key = (topic, head[1])
            offset = self.offsets.get(key, 0)
            self.offsets[key] = offset + 1
            firsts.setdefault(key, offset)
            rec = Record(topic, head[1], fields[5], fields[1].decode(), fields[2].decode(),
                         fields[3].decode(), fields[4], head[2], head[4], head[6], head[7],
                         base + start, offset)
            self.records.append(rec)
            if head[6]:
                self.seen[ident] = rec
            results.append({"msg_id": f"{self.group}@{rec.position:016X}",
                            "queue_id": rec.queue_id, "queue_offset": offset,
                            "duplicate": False})
        self.stored += len(blob)
        if duplicate:
            return {"results": results}
        return {"base": base,
                "queue_offsets": None if self.replicate_async else list(firsts.values())}
