"""Produce benchmark: a 3-node group on loopback, 1 KiB messages, JSON out.

For flush = async and flush = sync (replicate = sync in both):
  (a) per-message sends, 64 in flight;
  (b) batches of 64 messages (send_batch), 8 batches in flight, and again
      with 32 in flight (more producers' batches for the client to coalesce);
acknowledged messages per second and per-request latency p50/p99.
Then failover: SIGKILL the leader while a prober sends, time to the first
acknowledged send after the kill (it can only be on the new leader), over
`--kills` kills (the killed node is restarted before the next one); p50, max.

The client runs in this process, the NameServer and brokers in children: on a
2-core machine all of them share the CPUs, so the figures are for the whole
system on one box.

    .venv/bin/python bench/produce.py [--seconds 5] [--kills 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.launcher import LocalCluster, wait_leader
from client import Producer
from ledgermq import loop

BODY = b"x" * 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_load(producer: Producer, seconds: float, batch: int, in_flight: int
                   ) -> dict[str, float]:
    latencies: list[float] = []
    acked = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal acked
        while time.monotonic() < deadline:
            started = time.monotonic()
            if batch == 1:
                await producer.send("bench", BODY)
            else:
                await producer.send_batch("bench", [BODY] * batch)
            latencies.append(time.monotonic() - started)
            acked += batch

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.monotonic() - started
    return {"msgs_per_s": round(acked / elapsed), "acked": acked,
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}


async def throughput(base: Path, flush: str, seconds: float) -> dict[str, object]:
    cluster = LocalCluster(base / f"tp-{flush}", settings={
        "flush": flush, "replicate": "sync", "segment_size_bytes": 64 << 20})
    cluster.start()
    try:
        await wait_leader(cluster)
        producer = Producer([cluster.namesrv_address])
        await producer.create_topic("bench", queues=8)
        await run_load(producer, 1.0, 1, 16)  # warm-up: connections, routes
        single = await run_load(producer, seconds, 1, 64)
        batched = await run_load(producer, seconds, 64, 8)
        batched_32 = await run_load(producer, seconds, 64, 32)
        await producer.close()
        return {"flush": flush, "replicate": "sync", "single_64_in_flight": single,
                "batch_64": batched, "batch_64_32_in_flight": batched_32}
    finally:
        await asyncio.to_thread(cluster.stop)


async def failover(base: Path, kills: int) -> dict[str, object]:
    cluster = LocalCluster(base / "failover", settings={
        "flush": "async", "replicate": "sync", "segment_size_bytes": 64 << 20})
    cluster.start()
    times: list[float] = []
    try:
        producer = Producer([cluster.namesrv_address], send_timeout=1.0, retry_timeout=30.0)
        await wait_leader(cluster)
        await producer.create_topic("fo", queues=4)
        for _ in range(kills):
            leader = await wait_leader(cluster)
            for _ in range(20):  # the prober has a warm connection to the leader
                await producer.send("fo", b"warm")
            cluster.kill(leader)
            killed_at = time.monotonic()
            await producer.send("fo", b"probe")
            times.append(time.monotonic() - killed_at)
            cluster.start_node(leader)
            # Wait until the restarted node is a follower again before the next kill.
            await wait_leader(cluster)
        await producer.close()
    finally:
        await asyncio.to_thread(cluster.stop)
    return {"kills": kills, "p50_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3), "all_s": [round(t, 3) for t in times]}


async def main(args: argparse.Namespace) -> None:
    # Each run writes gigabytes: the directory goes whatever happens.
    base = Path(tempfile.mkdtemp(prefix="ledgermq-bench-"))
    results: dict[str, Any] = {"bench": "produce", "nodes": 3, "message_bytes": len(BODY),
                               "load_average_start": os.getloadavg(), "runs": []}
    try:
        for flush in ("async", "sync"):
            results["runs"].append(await throughput(base, flush, args.seconds))
        if args.kills:
            results["failover"] = await failover(base, args.kills)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # The machine is shared: a load average above the core count means the
    # figures are for the CPU share this benchmark got, not for the machine.
    results["load_average_end"] = os.getloadavg()
    results["cpus"] = os.cpu_count()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--kills", type=int, default=10, help="leader kills for failover (0: skip)")
    loop.run(main(parser.parse_args()))
