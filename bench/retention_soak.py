"""Retention soak: push far more than the disk budget through a 3-node group.

A 3-node group on loopback with small segments and a per-node disk budget
(`--disk-limit-gb`, default 2 GB). The brokers get `retention_bytes` = the
budget minus headroom for the segment being written, the ConsumeQueues,
index files and snapshots (`--headroom-segments` segments). Then:

1. producers send `--total-gb` (default 20 GB) of `--body-kb` messages in
   batches while a slow consumer reads one queue a few messages at a time;
   a sampler records every node's data-directory size once a second;
2. the slow consumer falls behind retention: the SDK gets the broker's
   "moved forward" answer (OFFSET_MOVED) and continues from the oldest
   retained message; the events are counted with the offsets skipped;
3. a follower is stopped, its data directory wiped, and restarted: it has
   nothing the leader still keeps in its log's head, so it rejoins by
   snapshot install; time until it has applied the leader's commit index,
   and the install's bytes and throughput from its status.

Prints one JSON document; `--plot` writes the disk-usage-over-time PNG.

    .venv/bin/python bench/retention_soak.py [--total-gb 20] [--disk-limit-gb 2]
        [--segment-mb 64] [--body-kb 64] [--plot bench-retention.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledgermq.base import loop
from ledgermq.base.errors import LedgerMQError
from ledgermq.broker.launcher import LocalCluster, node_status, wait_leader
from ledgermq.client import Producer
from ledgermq.client.consumer import PullConsumer

MIB = 1 << 20
GIB = 1 << 30
TOPIC = "soak"


def dir_bytes(path: Path) -> int:
    """Bytes of every regular file under `path` (what the node keeps on disk)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
    return total


async def produce(cluster: LocalCluster, total: int, body: bytes, batch: int,
                  in_flight: int, produced: list[int]) -> float:
    producer = Producer([cluster.namesrv_address], name="soak-producer")
    await producer.start()
    started = time.monotonic()
    messages = [body] * batch
    per_batch = len(body) * batch

    async def worker() -> None:
        while produced[0] < total:
            produced[0] += per_batch
            await producer.send_batch(TOPIC, messages)

    try:
        await asyncio.gather(*(worker() for _ in range(in_flight)))
    finally:
        await producer.close()
    return time.monotonic() - started


async def slow_consumer(cluster: LocalCluster, stop: asyncio.Event,
                        report: dict[str, Any]) -> None:
    """Read queue 0 a few messages at a time, far slower than the producers."""
    consumer = PullConsumer([cluster.namesrv_address], "soak-slow", name="soak-consumer")
    try:
        mq = (await consumer.queues(TOPIC))[0]
        offset = 0
        while not stop.is_set():
            try:
                result = await consumer.pull(mq, offset, max_messages=4)
            except LedgerMQError as exc:
                report["errors"].append(repr(exc)[:200])
                await asyncio.sleep(0.5)
                continue
            if result.moved_from is not None:  # OFFSET_MOVED: continued from the oldest
                report["moved_forward"] += 1
                first = result.messages[0].queue_offset if result.messages else result.min_offset
                report["skipped_messages"] += max(0, first - result.moved_from)
            report["read"] += len(result.messages)
            offset = result.next_offset
            await asyncio.sleep(0.2)
    finally:
        await consumer.close()


async def sample(cluster: LocalCluster, stop: asyncio.Event, produced: list[int],
                 samples: list[dict[str, Any]], started: float) -> None:
    while not stop.is_set():
        row = {"t": round(time.monotonic() - started, 2), "produced": produced[0]}
        for nid in cluster.peers:
            row[f"n{nid}"] = dir_bytes(cluster.base / f"n{nid}")
        samples.append(row)
        await asyncio.sleep(1.0)


async def status_of(cluster: LocalCluster, nid: int) -> dict[str, Any]:
    return await node_status(cluster.client_address(nid), timeout=2.0) or {}


async def rejoin_by_install(cluster: LocalCluster, leader: int) -> dict[str, Any]:
    """Wipe a follower and time its return through snapshot install."""
    follower = next(nid for nid in cluster.peers if nid != leader)
    cluster.kill(follower)
    shutil.rmtree(cluster.base / f"n{follower}")
    before = await status_of(cluster, leader)
    target = before.get("commit_index", 0)
    started = time.monotonic()
    cluster.start_node(follower)
    status: dict[str, Any] = {}
    while time.monotonic() - started < 600:
        status = await status_of(cluster, follower)
        if status.get("applied_index", 0) >= target:
            break
        await asyncio.sleep(0.1)
    seconds = time.monotonic() - started
    after = await status_of(cluster, leader)
    received = int(status.get("install_bytes_received", 0))
    # The leader streams (offer to last ack), the follower then installs
    # (staged files to log + state): the two make the install's time.
    transfer_s = float(after.get("transfer_seconds", 0.0)) - float(
        before.get("transfer_seconds", 0.0))
    install_s = transfer_s + float(status.get("install_seconds", 0.0))
    return {
        "node": follower, "leader_commit_at_restart": target,
        "applied_index": status.get("applied_index", 0),
        "caught_up": status.get("applied_index", 0) >= target,
        "seconds_to_caught_up": round(seconds, 2),
        "installs_received": status.get("installs_received", 0),
        "install_bytes": received,
        "transfer_seconds": round(transfer_s, 2),
        "install_seconds": round(install_s, 2),
        "install_mb_per_s": round(received / MIB / install_s, 1) if install_s else 0.0,
        "first_index": status.get("first_index"),
        "snapshot_index": status.get("snapshot_index"),
        "data_dir_bytes": dir_bytes(cluster.base / f"n{follower}"),
    }


def plot(samples: list[dict[str, Any]], limit: int, path: str, nodes: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = [s["t"] for s in samples]
    for nid in nodes:
        ax.plot(t, [s[f"n{nid}"] / GIB for s in samples], label=f"node {nid} data dir")
    ax.plot(t, [s["produced"] / GIB / 10 for s in samples], "--", label="produced / 10")
    ax.axhline(limit / GIB, color="red", linestyle=":", label="disk budget")
    ax.set_xlabel("seconds")
    ax.set_ylabel("GiB")
    ax.set_title("LedgerMQ retention soak: disk usage per node")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    segment = int(args.segment_mb * MIB)
    limit = int(args.disk_limit_gb * GIB)
    retention = limit - args.headroom_segments * segment
    if retention < 2 * segment:
        raise SystemExit("the disk budget must hold at least headroom + 2 segments")
    total = int(args.total_gb * GIB)
    body = os.urandom(int(args.body_kb * 1024))
    base = Path(tempfile.mkdtemp(prefix="lmq-soak-", dir=args.dir))
    settings = {
        "segment_size_bytes": segment, "retention_bytes": retention,
        "retention_interval_ms": args.retention_interval_ms,
        "snapshot_interval_bytes": max(segment, retention // 8),
        "flush": args.flush, "default_queues": 4,
    }
    cluster = LocalCluster(base, nodes=3, settings=settings)
    cluster.start()
    result: dict[str, Any] = {
        "bench": "retention_soak", "total_bytes": total, "disk_limit_bytes": limit,
        "retention_bytes": retention, "segment_bytes": segment, "body_bytes": len(body),
        "flush": args.flush,
    }
    try:
        leader = await wait_leader(cluster)
        producer = Producer([cluster.namesrv_address], name="soak-admin")
        await producer.start()
        await producer.create_topic(TOPIC, queues=4)
        await producer.close()
        stop = asyncio.Event()
        produced = [0]
        samples: list[dict[str, Any]] = []
        consumer_report: dict[str, Any] = {"read": 0, "moved_forward": 0,
                                           "skipped_messages": 0, "errors": []}
        started = time.monotonic()
        side = [asyncio.create_task(sample(cluster, stop, produced, samples, started)),
                asyncio.create_task(slow_consumer(cluster, stop, consumer_report))]
        seconds = await produce(cluster, total, body, args.batch, args.in_flight, produced)
        await asyncio.sleep(args.settle_s)  # let the last retention pass run
        stop.set()
        await asyncio.gather(*side)
        leader = await wait_leader(cluster)
        status = await status_of(cluster, leader)
        rejoin = await rejoin_by_install(cluster, leader)
        nodes = sorted(cluster.peers)
        peak = {f"n{nid}": max(s[f"n{nid}"] for s in samples) for nid in nodes}
        result.update({
            "produced_bytes": produced[0], "produce_seconds": round(seconds, 1),
            "produce_mb_per_s": round(produced[0] / MIB / seconds, 1),
            "samples": len(samples), "peak_data_dir_bytes": peak,
            "within_limit": all(v <= limit for v in peak.values()),
            "leader_first_index": status.get("first_index"),
            "leader_last_index": status.get("last_index"),
            "slow_consumer": {**consumer_report, "errors": consumer_report["errors"][:5]},
            "rejoin": rejoin,
        })
        if args.plot:
            plot(samples, limit, args.plot, nodes)
            result["plot"] = args.plot
        if args.samples_out:
            Path(args.samples_out).write_text(json.dumps(samples))
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-gb", type=float, default=20.0)
    parser.add_argument("--disk-limit-gb", type=float, default=2.0)
    parser.add_argument("--segment-mb", type=float, default=64.0)
    parser.add_argument("--headroom-segments", type=int, default=6)
    parser.add_argument("--body-kb", type=float, default=64.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--flush", default="sync", choices=("sync", "async"))
    parser.add_argument("--retention-interval-ms", type=int, default=1000)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="where the nodes' data go (default: /tmp)")
    parser.add_argument("--plot", default="", help="write the disk-usage PNG here")
    parser.add_argument("--samples-out", default="", help="write the raw samples (JSON) here")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    args = parser.parse_args()
    print(json.dumps(loop.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
