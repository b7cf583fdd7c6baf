"""Reference cycles left per operation: what only the cyclic collector frees,
on every process of a 3-node group, as JSON.

Each server process (three brokers and the name server) runs
bench/gc_hook/sitecustomize.py: on a signal it starts keeping what its cyclic
collector frees, on another it writes that down by type. The client (this
process) keeps its own the same way. Each phase below runs a fixed number of
operations of one kind between the two signals, so the figure is objects per
operation, a count that does not depend on the host's speed:

- `send_single`: sends with the SDK's merging off, 8 in flight;
- `send_merged`: sends with merging on, 64 in flight;
- `pull`: pulls of 16 messages each, from every queue, round robin;
- `pull_long_poll`: pulls at the end of a queue waiting 20 ms, which time out;
- `offsets`: a commit of a group's offset and a query of it;
- `push`: a push consumer (rebalance, long polls, offset commits) taking
  messages until it has seen the phase's count.

An answered request should leave nothing behind: every cycle is garbage
that piles up until the next collection, whose pause grows with it
(docs/broker.md, "Reference cycles and full collections").

    python bench/cycles.py [--ops 2000] [--flush async]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledgermq.base import loop  # noqa: E402
from ledgermq.broker.launcher import LocalCluster, wait_leader  # noqa: E402
from ledgermq.client import Producer, PullConsumer, PushConsumer  # noqa: E402
from ledgermq.client.model import ReceivedMessage  # noqa: E402

BODY = b"x" * 1024
TOPIC = "cycles"
QUEUES = 4
HOOK = Path(__file__).resolve().parent / "gc_hook"
TOP_TYPES = 8


class Probe:
    """Starts and stops the keeping of cyclic garbage in every process."""

    def __init__(self, pids: dict[str, int], folder: Path) -> None:
        self.pids, self.folder = pids, folder

    def start(self) -> None:
        for path in self.folder.glob("*.json"):
            path.unlink()
        for pid in self.pids.values():
            os.kill(pid, signal.SIGUSR1)
        gc.collect()
        gc.garbage.clear()
        gc.set_debug(gc.DEBUG_SAVEALL)

    async def stop(self, ops: int) -> dict[str, Any]:
        gc.collect()
        gc.set_debug(0)
        kept: dict[str, Counter[str]] = {
            "client": Counter(type(obj).__qualname__ for obj in gc.garbage)}
        gc.garbage.clear()
        for pid in self.pids.values():
            os.kill(pid, signal.SIGUSR2)
        for name, pid in self.pids.items():
            path = self.folder / f"{pid}.json"
            deadline = time.monotonic() + 30
            while not path.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} (pid {pid}) wrote no garbage count")
                await asyncio.sleep(0.05)
            kept[name] = Counter(json.loads(path.read_text()))
        return {name: {"objects_per_op": round(sum(counts.values()) / ops, 3),
                       "top_types": dict(counts.most_common(TOP_TYPES))}
                for name, counts in kept.items()}


async def send_single(namesrv: str, ops: int) -> None:
    async with Producer([namesrv], coalesce=False) as producer:
        await _window(ops, 8, lambda: producer.send(TOPIC, BODY))


async def send_merged(namesrv: str, ops: int) -> None:
    async with Producer([namesrv]) as producer:
        await _window(ops, 64, lambda: producer.send(TOPIC, BODY))


async def _window(ops: int, window: int, op: Callable[[], Awaitable[Any]]) -> None:
    left = ops

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await op()

    await asyncio.gather(*(worker() for _ in range(window)))


async def pull(consumer: PullConsumer, ops: int) -> None:
    queues = await consumer.queues(TOPIC)
    offsets = dict.fromkeys(queues, 0)
    for k in range(ops):
        mq = queues[k % len(queues)]
        result = await consumer.pull(mq, offsets[mq], max_messages=16)
        offsets[mq] = result.next_offset if result.messages else 0


async def pull_long_poll(consumer: PullConsumer, ops: int) -> None:
    queues = await consumer.queues(TOPIC)
    ends = {mq: (await consumer.queue_range(mq))[1] for mq in queues}
    for k in range(ops):
        mq = queues[k % len(queues)]
        result = await consumer.pull(mq, ends[mq], max_messages=16, wait_ms=20)
        if result.messages:
            raise AssertionError("a message arrived in a quiet queue")


async def offsets(consumer: PullConsumer, ops: int) -> None:
    queues = await consumer.queues(TOPIC)
    for k in range(ops // 2):
        mq = queues[k % len(queues)]
        await consumer.commit(mq, k)
        await consumer.committed(mq)


async def push(namesrv: str, ops: int) -> None:
    seen = 0
    enough = asyncio.Event()

    def take(_message: ReceivedMessage) -> None:
        nonlocal seen
        seen += 1
        if seen >= ops:
            enough.set()

    async with PushConsumer([namesrv], "cycles-push", TOPIC, take, long_poll_ms=200,
                            batch_size=16):
        async with asyncio.timeout(120):
            await enough.wait()


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    folder = base / "garbage"
    folder.mkdir()
    os.environ["LEDGERMQ_GC_PROBE_DIR"] = str(folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HOOK), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    cluster = LocalCluster(base / "cluster", settings={
        "flush": args.flush, "replicate": "sync", "segment_size_bytes": 64 << 20})
    cluster.start()
    try:
        leader = await wait_leader(cluster)
        namesrv = cluster.namesrv_address
        assert cluster.namesrv is not None
        pids = {"namesrv": cluster.namesrv.proc.pid, "leader": cluster.brokers[leader].proc.pid}
        followers = sorted(nid for nid in cluster.brokers if nid != leader)
        for k, nid in enumerate(followers, 1):
            pids[f"follower_{k}"] = cluster.brokers[nid].proc.pid
        async with Producer([namesrv]) as producer:
            await producer.create_topic(TOPIC, queues=QUEUES)
            await _window(args.ops, 64, lambda: producer.send(TOPIC, BODY))  # to pull
        probe = Probe(pids, folder)
        phases: dict[str, Any] = {}
        consumer = PullConsumer([namesrv], "cycles-pull")
        try:
            await pull(consumer, 8)  # routes known before the probe starts
            for name, phase in (
                    ("send_single", lambda: send_single(namesrv, args.ops)),
                    ("send_merged", lambda: send_merged(namesrv, args.ops)),
                    ("pull", lambda: pull(consumer, args.ops)),
                    ("pull_long_poll", lambda: pull_long_poll(consumer, args.ops // 10)),
                    ("offsets", lambda: offsets(consumer, args.ops)),
                    ("push", lambda: push(namesrv, args.ops))):
                ops = args.ops // 10 if name == "pull_long_poll" else args.ops
                probe.start()
                started = time.monotonic()
                await phase()
                phases[name] = {"ops": ops, "seconds": round(time.monotonic() - started, 2),
                                **await probe.stop(ops)}
        finally:
            await consumer.close()
        if await wait_leader(cluster) != leader:
            raise RuntimeError("leadership moved during the probe: run it again")
        return {"bench": "cycles", "flush": args.flush, "ops": args.ops, "phases": phases}
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per phase")
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-cycles-") as base:
        print(json.dumps(loop.run(run(args, Path(base))), indent=2))


if __name__ == "__main__":
    main()
