"""Produce benchmark: a 3-node group on loopback, 1 KiB messages, JSON out.

For flush = async and flush = sync (replicate = sync in both):
  (a) per-message sends, 64 in flight;
  (b) batches of 64 messages (send_batch), 8 batches in flight, and again
      with 32 in flight (more producers' batches for the client to coalesce);
acknowledged messages per second, per-request latency p50/p99, and the CPU
time each process (leader, followers, client) spent per acknowledged message.
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

from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, wait_leader
from ledgermq.client import Producer

BODY = b"x" * 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibrate() -> float:
    """Seconds for a fixed pure-Python workload on this process's core.

    The VM's speed drifts with its host's load (the same commit has measured
    ±30% apart within an hour, with the same CPU split between processes),
    so each JSON carries this figure from its start and its end: compare
    runs only where it matches."""
    def once() -> float:
        started = time.process_time()
        total = 0
        for i in range(1_000_000):
            total += i & 7
        return time.process_time() - started

    return round(statistics.median(once() for _ in range(5)), 4)


async def run_load(producer: Producer, seconds: float, batch: int, in_flight: int,
                   processes: dict[str, int] | None = None) -> dict[str, Any]:
    """Acked msg/s and latency; with `processes` (name -> pid), also each
    one's CPU microseconds per acknowledged message."""
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

    processes = processes or {}
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.monotonic() - started
    result: dict[str, Any] = {"msgs_per_s": round(acked / elapsed), "acked": acked,
                              "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
                              "p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}
    if processes and acked:
        result["cpu_us_per_msg"] = {
            name: round((cpu_seconds(pid) - cpu_before[name]) / acked * 1e6, 1)
            for name, pid in processes.items()}
    return result


async def throughput(base: Path, flush: str, seconds: float) -> dict[str, object]:
    cluster = LocalCluster(base / f"tp-{flush}", settings={
        "flush": flush, "replicate": "sync", "segment_size_bytes": 64 << 20})
    cluster.start()
    try:
        await wait_leader(cluster)
        producer = Producer([cluster.namesrv_address])
        await producer.create_topic("bench", queues=8)
        await run_load(producer, 1.0, 1, 16)  # warm-up: connections, routes
        leader = await wait_leader(cluster)
        processes = {"client": os.getpid()}
        for nid, child in sorted(cluster.brokers.items()):
            processes["leader" if nid == leader else f"follower_{nid}"] = child.proc.pid
        single = await run_load(producer, seconds, 1, 64, processes)
        batched = await run_load(producer, seconds, 64, 8, processes)
        batched_32 = await run_load(producer, seconds, 64, 32, processes)
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
                               "load_average_start": os.getloadavg(),
                               "calibration_s_start": calibrate(), "runs": []}
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
    results["calibration_s_end"] = calibrate()
    results["cpus"] = os.cpu_count()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--kills", type=int, default=10, help="leader kills for failover (0: skip)")
    loop.run(main(parser.parse_args()))
