"""Acknowledged messages, and the checks a fuzz run must pass afterwards.

`AckLedger` sends numbered messages through the client SDK and keeps every
acknowledged one (queue, queue offset, body): some before the fuzzing starts
and a steady trickle while it runs. `verify` then asks, of the servers the
fuzzer hit: is every process alive; does every wire port, admin app and
Raft port answer; does the group have a ready leader that every node has
caught up with; does a new message go in and come back out; and does every
node serve every acknowledged message at the offset it was acknowledged at.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.client import Producer
from ledgermq.wire import RpcClient


@dataclass
class Targets:
    """Where the servers are. `alive` reports every process by name (from the
    launcher, which holds their PIDs)."""

    namesrv: str
    brokers: dict[int, str]
    raft: dict[int, str]
    http: dict[str, str]
    alive: Callable[[], dict[str, bool]]
    group: str = "broker-a"


@dataclass
class AckLedger:
    """Every acknowledged message: (queue id, queue offset) -> body."""

    namesrv: str
    topic: str
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    failed: int = 0
    _producer: Producer | None = None
    _sent: int = 0

    async def start(self, queues: int = 4) -> None:
        self._producer = Producer([self.namesrv], send_timeout=3.0, retry_timeout=10.0,
                                  name="fuzz-oracle")
        await self._producer.create_topic(self.topic, queues=queues)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    async def send(self, phase: str) -> bool:
        """One numbered message; True when it was acknowledged with an offset."""
        assert self._producer is not None
        self._sent += 1
        body = f"{phase}-{self._sent:08d}".encode()
        try:
            result = await self._producer.send(self.topic, body)
        except Exception:  # not acknowledged, so not owed: only counted
            self.failed += 1
            return False
        if result.queue_offset is None:
            self.failed += 1
            return False
        self.acked[(result.queue.queue_id, result.queue_offset)] = body
        return True

    async def send_many(self, phase: str, count: int) -> None:
        for _ in range(count):
            await self.send(phase)

    async def trickle(self, stop: asyncio.Event, interval_s: float = 0.05) -> None:
        """Send one message every `interval_s` until `stop` is set."""
        while not stop.is_set():
            await self.send("during")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()


async def _wire(address: str, code: int, body: Any = None, timeout: float = 3.0) -> Any:
    host, port = split_host_port(address)
    client = await RpcClient.connect(host, port, role="admin", timeout=timeout)
    try:
        return await client.request(code, body, timeout=timeout)
    finally:
        await client.close()


async def _converged(targets: Targets, timeout: float) -> tuple[int, list[str]]:
    """Wait for a ready leader whose commit every node has applied; (commit, problems)."""
    deadline = time.monotonic() + timeout
    last: list[str] = []
    while time.monotonic() < deadline:
        statuses: dict[int, dict[str, Any]] = {}
        last = []
        for nid, address in targets.brokers.items():
            try:
                statuses[nid] = await _wire(address, RequestCode.BROKER_STATUS, timeout=1.0)
            except Exception as exc:
                last.append(f"broker {nid} status: {exc!r}")
        leaders = [s for s in statuses.values()
                   if s.get("role") == "leader" and s.get("leader_ready")]
        if len(leaders) == 1 and len(statuses) == len(targets.brokers):
            commit = leaders[0]["commit_index"]
            # Pulls are served from the ConsumeQueues: dispatched, not just applied.
            behind = [n for n, s in statuses.items()
                      if min(s["applied_index"], s.get("dispatched_index", commit)) < commit]
            if not behind:
                return commit, []
            last.append(f"nodes {behind} behind the leader's commit {commit}")
        elif not leaders:
            last.append("no ready leader: " + ", ".join(
                f"n{n} {s.get('role')}@{s.get('term')} failed={s.get('failed')}"
                for n, s in statuses.items()))
        await asyncio.sleep(0.2)
    return 0, last or ["the group did not converge"]


async def _read_queue(address: str, topic: str, queue_id: int) -> dict[int, bytes]:
    """Every message of one queue on one node: queue offset -> body."""
    out: dict[int, bytes] = {}
    host, port = split_host_port(address)
    client = await RpcClient.connect(host, port, role="admin", timeout=3.0)
    try:
        offset = 0
        while True:
            reply = await client.request(RequestCode.PULL_MESSAGES, {
                "topic": topic, "queue_id": queue_id, "offset": max(offset, 0),
                "max_messages": 256}, timeout=5.0)
            if offset < reply["min_offset"]:
                offset = reply["min_offset"]
                continue
            for m in reply["messages"]:
                out[m["queue_offset"]] = m["body"]
            if reply["next_offset"] <= offset or reply["next_offset"] >= reply["max_offset"]:
                return out
            offset = reply["next_offset"]
    finally:
        await client.close()


async def _http_ok(url: str) -> str | None:
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(url.rstrip("/") + "/api/v1/info",
                            timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return f"{url}: HTTP {resp.status}"
    except Exception as exc:
        return f"{url}: {exc!r}"
    return None


async def _raft_accepts(address: str) -> str | None:
    host, port = split_host_port(address)
    try:
        async with asyncio.timeout(3.0):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        return f"raft {address}: {exc!r}"
    writer.close()
    return None


async def verify(targets: Targets, ledger: AckLedger, timeout: float = 30.0) -> list[str]:
    """Every check after a run; the list of problems (empty: the run passed)."""
    problems = [f"process {name} is not running"
                for name, up in targets.alive().items() if not up]
    try:
        cluster = await _wire(targets.namesrv, RequestCode.GET_CLUSTER)
        if targets.group not in cluster.get("groups", {}):
            problems.append(f"the NameServer no longer lists group {targets.group}")
    except Exception as exc:
        problems.append(f"namesrv {targets.namesrv} does not answer: {exc!r}")
    for url in targets.http.values():
        if (problem := await _http_ok(url)) is not None:
            problems.append(problem)
    for address in targets.raft.values():
        if (problem := await _raft_accepts(address)) is not None:
            problems.append(problem)
    _, stuck = await _converged(targets, timeout)
    problems += stuck
    if stuck:
        return problems
    # A real request after the fuzzing: a new message is acknowledged...
    if not await ledger.send("after"):
        problems.append("a message sent after the fuzzing was not acknowledged")
    _, stuck = await _converged(targets, timeout)
    problems += stuck
    # ...and it, and everything acknowledged before, is on every node.
    queues = {q for q, _ in ledger.acked}
    for nid, address in targets.brokers.items():
        stored: dict[tuple[int, int], bytes] = {}
        try:
            for q in queues:
                stored.update({(q, off): body for off, body in
                               (await _read_queue(address, ledger.topic, q)).items()})
        except Exception as exc:
            problems.append(f"broker {nid}: reading {ledger.topic} failed: {exc!r}")
            continue
        lost = [key for key, body in ledger.acked.items() if stored.get(key) != body]
        if lost:
            problems.append(f"broker {nid}: {len(lost)} of {len(ledger.acked)} acknowledged "
                            f"messages missing or changed, e.g. {sorted(lost)[:5]}")
    return problems
