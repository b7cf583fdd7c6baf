"""Retention soak: push far more than the disk budget through a 3-node group.

A 3-node group on loopback with small segments and a per-node disk budget
(`--disk-limit-gb`, GiB, default 2). Then:

1. producers send `--total-gb` (GiB of message bodies, default 20) of
   `--body-kb` messages in batches while a slow consumer reads one queue a
   few messages at a time; a sampler records every node's data directory
   four times a second, split into segments, index, ConsumeQueues,
   snapshots and the rest;
2. the slow consumer falls behind retention: the SDK gets the broker's
   "moved forward" answer (OFFSET_MOVED) and continues from the oldest
   retained message; the events are counted with the offsets skipped;
3. a follower is stopped, its data directory wiped, and restarted: it has
   nothing the leader still keeps in its log's head, so it rejoins by
   snapshot install; time until it has applied the leader's commit index,
   and the install's bytes and throughput from its status. The sampler
   keeps running through it.

The limit is the whole data directory of each node, as the file system
counts it (allocated blocks of every file under it). The brokers'
`retention_bytes` limits CommitLog segments only, and the policy keeps it a
ceiling: every pass cuts below it by what the log grew between passes
(measured; `broker/retention.py`). So the budget is split as

    limit = retention_bytes + index + consumequeue + snapshots + small + blocks

with each other term the most the storage rules let it hold in this run:

- index: 32-byte records, deleted by whole files of `index_file_records`
  (1 Mi records): at most one file beyond the retained entries' records
  (32 MiB), never more than one record per entry of the run;
- consumequeue: 20-byte units, deleted by whole files of 300 000 units: per
  queue at most one file beyond the retained messages' units, never more
  than the run's messages;
- snapshots: the 2 kept plus one being written, of at most
  `--snapshot-max-kb` of state each (checked: the run reports the largest
  snapshot directory seen);
- small: LOCK, checkpoint, hardstate and the ConsumeQueue checkpoint;
- blocks: every file rounds up to a 4 KiB block.

`budget` in the JSON has each term, and `observed` the peak of each
component, so every bound can be checked against the run.

Prints one JSON document; `--plot` writes the disk-usage-over-time PNG and
`--samples-out` the raw samples.

    .venv/bin/python bench/retention_soak.py [--total-gb 20] [--disk-limit-gb 2]
        [--segment-mb 64] [--body-kb 64] [--plot docs/retention_soak.png]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from commitlog.config import CommitLogConfig
from commitlog.index_file import RECORD_SIZE
from consumequeue import UNIT_SIZE, ConsumeQueueStore
from ledgermq.base import loop
from ledgermq.base.errors import LedgerMQError
from ledgermq.broker.launcher import LocalCluster, node_status, wait_leader
from ledgermq.broker.snapshots import KEEP
from ledgermq.client import Producer
from ledgermq.client.consumer import PullConsumer

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TOPIC = "soak"
QUEUES = 4
BLOCK = 4096
# The top-level files of a data directory besides the parts below: LOCK,
# checkpoint, hardstate.
SMALL_FILES = 3
PARTS = ("commitlog", "index", "consumequeue", "snapshots")


def dir_bytes(path: Path) -> tuple[int, dict[str, int], int]:
    """What a node keeps on disk: (allocated bytes of every regular file
    under `path`, those bytes per top-level part of PARTS plus "other",
    number of files)."""
    total, files = 0, 0
    parts = dict.fromkeys((*PARTS, "other"), 0)
    stack = [(str(path), "")]
    while stack:
        directory, part = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, part or entry.name))
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_blocks * 512
                    total += size
                    files += 1
                    parts[part if part in parts else "other"] += size
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
    return total, parts, files


def budget(args: argparse.Namespace, limit: int, segment: int, body: int,
           total: int) -> dict[str, int]:
    """Split the per-node limit: what the storage rules let everything but
    the segments hold in this run; `retention_bytes` gets the rest (see the
    module docstring). Every term counts its files' rounding to blocks."""
    records_per_file = CommitLogConfig().index_file_records
    units_per_file = inspect.signature(ConsumeQueueStore).parameters["units_per_file"].default
    messages = math.ceil(total / body) + args.batch * args.in_flight  # the last batches overshoot
    per_queue = math.ceil(messages / QUEUES)
    retained_per_queue = math.ceil(limit / body / QUEUES)
    # The run's entry count is not known beforehand (control entries: trims,
    # the topic, each term's no-op), so the one-file rule bounds the index:
    # at most a whole file below the first retained entry, plus the records
    # of the retained data entries; in two files.
    index = RECORD_SIZE * (records_per_file + math.ceil(limit / (args.batch * body))) + 2 * BLOCK
    # Per queue at most two files (one partly below the first retained
    # message), plus the ConsumeQueue checkpoint.
    consumequeue = QUEUES * (UNIT_SIZE * min(per_queue, retained_per_queue + units_per_file)
                             + 2 * BLOCK) + BLOCK
    # Each snapshot is a directory of two files: state and meta.
    snapshots = (KEEP + 1) * (int(args.snapshot_max_kb * KIB) + 2 * BLOCK)
    small = SMALL_FILES * BLOCK
    # The segments the limit can hold whole, the one being written and one
    # more being deleted, each rounded up to a block.
    segment_rounding = (limit // segment + 2) * BLOCK
    overhead = index + consumequeue + snapshots + small + segment_rounding
    return {"limit": limit, "retention_bytes": limit - overhead, "index": index,
            "consumequeue": consumequeue, "snapshots": snapshots, "other": small,
            "segment_rounding": segment_rounding, "overhead": overhead}


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
                 samples: list[dict[str, Any]], started: float, phase: list[str]) -> None:
    """Every node's data directory, 4 times a second, until `stop`."""
    while not stop.is_set():
        row: dict[str, Any] = {"t": round(time.monotonic() - started, 2),
                               "produced": produced[0], "phase": phase[0]}
        for nid in cluster.peers:
            size, parts, _ = dir_bytes(cluster.base / f"n{nid}")
            row[f"n{nid}"] = size
            row[f"n{nid}_parts"] = parts
        samples.append(row)
        await asyncio.sleep(0.25)


async def status_of(cluster: LocalCluster, nid: int) -> dict[str, Any]:
    return await node_status(cluster.client_address(nid), timeout=2.0) or {}


async def retention_of(cluster: LocalCluster, nid: int) -> dict[str, Any]:
    """What node `nid`'s retention did (its admin app's GET /retention)."""
    url = (await status_of(cluster, nid)).get("admin_url")
    if not url:
        return {}
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"{url}/api/v1/retention", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            view: dict[str, Any] = await resp.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return {"error": repr(exc)}
    policy = view["trim"]["policy"]
    return {"role": view["role"], "headroom_bytes": policy["headroom"],
            "segments_deleted": view["deleted"]["segments"],
            "bytes_deleted": view["deleted"]["bytes"],
            "consumequeue_files_deleted": view["deleted"]["consumequeue_files"],
            "snapshots_requested": view["snapshots_requested"],
            "held_by": view["trim"]["local_bound"]["held_by"]}


async def rejoin_by_install(cluster: LocalCluster, leader: int,
                            phase: list[str]) -> dict[str, Any]:
    """Wipe a follower and time its return through snapshot install."""
    follower = next(nid for nid in cluster.peers if nid != leader)
    phase[0] = "wiped"
    cluster.kill(follower)
    shutil.rmtree(cluster.base / f"n{follower}")
    before = await status_of(cluster, leader)
    target = before.get("commit_index", 0)
    started = time.monotonic()
    cluster.start_node(follower)
    phase[0] = "rejoin"
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
        "data_dir_bytes": dir_bytes(cluster.base / f"n{follower}")[0],
    }


def plot(samples: list[dict[str, Any]], plan: dict[str, int], path: str, nodes: list[int],
         leader: int, follower: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, low) = plt.subplots(2, 1, figsize=(10, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [2.2, 1]})
    t = [s["t"] for s in samples]
    for nid in nodes:
        role = "leader" if nid == leader else "follower, wiped" if nid == follower else "follower"
        ax.plot(t, [s[f"n{nid}"] / GIB for s in samples], linewidth=0.8,
                label=f"node {nid} ({role}): data dir")
    ax.plot(t, [s[f"n{leader}_parts"]["commitlog"] / GIB for s in samples], color="grey",
            linewidth=0.6, label=f"node {leader}: segments only")
    total = max(s["produced"] for s in samples) or 1
    ax2 = ax.twinx()
    ax2.plot(t, [s["produced"] / GIB for s in samples], "--", color="black", linewidth=0.8,
             label="produced (right axis)")
    ax2.set_ylim(0, total / GIB * 1.05)
    ax2.set_ylabel("GiB produced")
    ax.axhline(plan["limit"] / GIB, color="red", linestyle=":", label="limit (data dir)")
    ax.axhline(plan["retention_bytes"] / GIB, color="orange", linestyle=":",
               label="retention_bytes (segments)")
    wiped = next((s["t"] for s in samples if s["phase"] != "produce"), None)
    if wiped is not None:
        ax.axvline(wiped, color="purple", linestyle="--", linewidth=0.8,
                   label=f"node {follower} wiped, rejoins by install")
    ax.set_ylim(0, plan["limit"] / GIB * 1.45)
    # The margin itself, where the top panel's lines merge: what is left of
    # the limit on each node (below 0 would be over it).
    for nid in nodes:
        low.plot(t, [(plan["limit"] - s[f"n{nid}"]) / MIB for s in samples], linewidth=0.7,
                 label=f"node {nid}")
    low.axhline(0, color="red", linestyle=":")
    low.set_ylim(0, plan["overhead"] / MIB * 4)
    low.set_ylabel("MiB left of the limit")
    low.set_xlabel("seconds")
    low.legend(loc="upper right", fontsize=8, ncol=3)
    ax.set_ylabel("GiB on disk per node")
    ax.set_title("LedgerMQ retention soak: disk usage per node under a sustained producer")
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def peaks(samples: list[dict[str, Any]], nodes: list[int]) -> dict[str, Any]:
    """Per node: the peak of its data directory and of each part of it."""
    out: dict[str, Any] = {}
    for nid in nodes:
        key = f"n{nid}"
        parts = {part: max(s[f"{key}_parts"][part] for s in samples)
                 for part in (*PARTS, "other")}
        out[key] = {"data_dir": max(s[key] for s in samples), **parts}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    segment = int(args.segment_mb * MIB)
    limit = int(args.disk_limit_gb * GIB)
    total = int(args.total_gb * GIB)
    body = os.urandom(int(args.body_kb * KIB))
    plan = budget(args, limit, segment, len(body), total)
    retention = plan["retention_bytes"]
    if retention < 4 * segment:
        raise SystemExit(f"the disk budget leaves {retention} bytes for segments (budget:"
                         f" {plan}); it must hold at least 4 segments")
    base = Path(tempfile.mkdtemp(prefix="lmq-soak-", dir=args.dir))
    settings = {
        "segment_size_bytes": segment, "retention_bytes": retention,
        "retention_interval_ms": args.retention_interval_ms,
        "snapshot_interval_bytes": max(segment, retention // 8),
        "flush": args.flush, "default_queues": QUEUES,
        # Only the size rule under test deletes, whatever this disk holds.
        "disk_soft_ratio": 1.0, "disk_hard_ratio": 1.0,
    }
    cluster = LocalCluster(base, nodes=3, settings=settings, log_level=args.log_level,
                           admin_listen="127.0.0.1:0")
    cluster.start()
    result: dict[str, Any] = {
        "bench": "retention_soak", "total_bytes": total, "disk_limit_bytes": limit,
        "retention_bytes": retention, "segment_bytes": segment, "body_bytes": len(body),
        "batch": args.batch, "in_flight": args.in_flight, "flush": args.flush,
        "retention_interval_ms": args.retention_interval_ms,
        "snapshot_interval_bytes": settings["snapshot_interval_bytes"], "budget": plan,
    }
    stop = asyncio.Event()
    side: list[asyncio.Task[None]] = []
    try:
        leader = await wait_leader(cluster)
        producer = Producer([cluster.namesrv_address], name="soak-admin")
        await producer.start()
        await producer.create_topic(TOPIC, queues=QUEUES)
        await producer.close()
        produced = [0]
        phase = ["produce"]
        samples: list[dict[str, Any]] = []
        consumer_report: dict[str, Any] = {"read": 0, "moved_forward": 0,
                                           "skipped_messages": 0, "errors": []}
        consumer_stop = asyncio.Event()
        started = time.monotonic()
        side = [asyncio.create_task(sample(cluster, stop, produced, samples, started, phase)),
                asyncio.create_task(slow_consumer(cluster, consumer_stop, consumer_report))]
        seconds = await produce(cluster, total, body, args.batch, args.in_flight, produced)
        await asyncio.sleep(args.settle_s)  # let the last retention pass run
        consumer_stop.set()
        await side[1]
        leader = await wait_leader(cluster)
        status = await status_of(cluster, leader)
        nodes = sorted(cluster.peers)
        retention_figures = {f"n{nid}": await retention_of(cluster, nid) for nid in nodes}
        during = [s for s in samples if s["phase"] == "produce"]
        rejoin = await rejoin_by_install(cluster, leader, phase)
        await asyncio.sleep(1.0)  # a few samples of the rejoined node
        stop.set()
        await side[0]
        peak = peaks(during, nodes)
        overall = peaks(samples, nodes)
        follower = rejoin["node"]
        result.update({
            "produced_bytes": produced[0], "produce_seconds": round(seconds, 1),
            "produce_mb_per_s": round(produced[0] / MIB / seconds, 1),
            "samples": len(samples), "sample_interval_s": 0.25,
            "peak_while_producing": peak,
            "peak_data_dir_bytes": {k: v["data_dir"] for k, v in overall.items()},
            "within_limit": all(v["data_dir"] <= limit for v in overall.values()),
            # Segments rounded up to blocks may exceed the bytes they hold
            # by the budget's rounding term.
            "segments_within_retention_bytes": all(
                v["commitlog"] <= retention + plan["segment_rounding"]
                for v in overall.values()),
            # While producing (an install stages the log under install.tmp/,
            # "other": the rejoin's own peak is below).
            "bounds_held": {part: all(v[part] <= plan[part] for v in peak.values())
                            for part in ("index", "consumequeue", "snapshots", "other")},
            "leader": leader,
            "leader_first_index": status.get("first_index"),
            "leader_last_index": status.get("last_index"),
            "retention": retention_figures,
            "slow_consumer": {**consumer_report, "errors": consumer_report["errors"][:5]},
            "rejoin": {**rejoin, "peak_data_dir_bytes": max(
                s[f"n{follower}"] for s in samples if s["phase"] != "produce")},
        })
        if args.plot:
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            plot(samples, plan, args.plot, nodes, leader, follower)
            result["plot"] = args.plot
        if args.samples_out:
            Path(args.samples_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.samples_out).write_text(json.dumps(samples))
            result["samples_out"] = args.samples_out
    finally:
        stop.set()
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        cluster.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-gb", type=float, default=20.0,
                        help="GiB of message bodies to send")
    parser.add_argument("--disk-limit-gb", type=float, default=2.0,
                        help="GiB each node's data directory may hold")
    parser.add_argument("--segment-mb", type=float, default=64.0)
    parser.add_argument("--body-kb", type=float, default=64.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--flush", default="sync", choices=("sync", "async"))
    parser.add_argument("--retention-interval-ms", type=int, default=1000)
    parser.add_argument("--snapshot-max-kb", type=float, default=1024.0,
                        help="the bound on one snapshot's state in the budget (checked)")
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="where the nodes' data go (default: /tmp)")
    parser.add_argument("--plot", default="", help="write the disk-usage PNG here")
    parser.add_argument("--samples-out", default="", help="write the raw samples (JSON) here")
    parser.add_argument("--log-level", default="WARNING", help="the brokers' log level")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    args = parser.parse_args()
    print(json.dumps(loop.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
