"""Broker start-up time against log length, with a recent snapshot: prints JSON.

For each size it builds a one-node broker's data directory the fast way —
the storage APIs directly, as the broker itself would have left it: a
CommitLog of MESSAGES entries (64 messages of 1 KiB each), its ConsumeQueues
dispatched and checkpointed, the hard state, and a broker-state snapshot
taken `--tail-mib` of log before the end (by default just under the default
`snapshot_interval_bytes`: the most log a start can have to replay under the
defaults). Then it starts a real `Broker` on it `--rounds` times and times
`Broker.start()` (recovery, Raft node, client port) and, separately, the
moment the node can serve writes (its election included). With `--cold` the
page cache is dropped before each start (root only; it is machine-wide), so
the start reads what it needs from disk.

With `--contrast` the smallest size is also started with its snapshots moved
aside: the whole-log replay that snapshots avoid.

Usage: python bench/startup.py [--sizes-mib 1024,10240] [--dir PATH] [--rounds 3]
                                [--tail-mib 63] [--contrast] [--cold] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, HardState, Message, encode_messages
from commitlog.columns import scan_body
from commitlog.snapshot import write_snapshot
from consumequeue import ConsumeQueueStore
from ledgermq.base.loop import run
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.broker.state import BrokerState, StateCapture

MIB = 1 << 20
MESSAGES_PER_ENTRY = 64
MESSAGE_BYTES = 1024
ENTRIES_PER_WRITE = 64  # one append_new call: 4 MiB


def broker_config(data_dir: str, segment_mib: int) -> BrokerConfig:
    return BrokerConfig(group="bench", node_id=1, data_dir=data_dir,
                        peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")},
                        segment_size_bytes=segment_mib * MIB, flush="async")


def log_config(config: BrokerConfig) -> CommitLogConfig:
    """The CommitLog settings the broker opens its log with."""
    return CommitLogConfig(
        segment_size_bytes=config.segment_size_bytes, flush=config.flush,
        message_size_bytes_max=config.message_size_bytes_max,
        entry_size_bytes_max=max(8 << 20, config.batch_max_bytes + (1 << 20)))


def entry_body() -> bytes:
    """64 messages of ~1 KiB over 8 queues of one topic (the same body each
    entry: the CommitLog, state and queues do the same work for any bytes)."""
    messages = [Message("BenchTopic", bytes([i]) * (MESSAGE_BYTES - 64), queue_id=i % 8,
                        tags="t") for i in range(MESSAGES_PER_ENTRY)]
    return encode_messages(messages, 1 << 20)


def build(data_dir: str, config: BrokerConfig, size_bytes: int, tail_bytes: int
          ) -> dict[str, object]:
    """Write a data directory of `size_bytes` of log with a snapshot
    `tail_bytes` before its end."""
    started = time.perf_counter()
    body = entry_body()
    entry_bytes = len(body) + 48
    entries = max(2, size_bytes // entry_bytes)
    snapshot_at = max(1, entries - max(0, tail_bytes // entry_bytes))
    state = BrokerState()
    capture: StateCapture | None = None
    snap_term = snap_end = 0
    with CommitLog.open(data_dir, log_config(config)) as log_:
        queues = ConsumeQueueStore(data_dir, log_)
        written = 0
        while written < entries:
            count = min(ENTRIES_PER_WRITE, entries - written)
            log_.append_new([(1, [(KIND_MESSAGES, body)] * count)], checked=written > 0)
            batch = log_.read_entries(written + 1, written + count + 1)
            columns = [scan_body(e.body) for e in batch]
            for entry, scanned in zip(batch, columns, strict=True):
                state.apply(entry, scanned)
                if entry.index == snapshot_at:
                    capture, snap_term, snap_end = state.capture(), entry.term, entry.end
            queues.dispatch(batch, columns)
            written += count
        log_.flush()
        queues.close()  # checkpointed: dispatched up to the last entry
        log_.save_hard_state(HardState(term=1, vote=1, commit=log_.last_index))
        log_bytes, last = log_.end, log_.last_index
    assert capture is not None
    info = write_snapshot(data_dir, snapshot_at, snap_term, snap_end, capture.encode())
    return {"log_bytes": log_bytes, "entries": last, "messages": last * MESSAGES_PER_ENTRY,
            "snapshot_index": info.index, "snapshot_state_bytes": info.state_bytes,
            "tail_entries": last - snapshot_at, "build_s": round(time.perf_counter() - started, 2)}


def drop_page_cache() -> bool:
    """Write back and drop the page cache, when this process may (root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError:
        return False
    return True


async def start_once(config: BrokerConfig) -> dict[str, object]:
    begin = time.perf_counter()
    broker = Broker(config)
    try:
        await broker.start()
        started = time.perf_counter() - begin
        await broker.node.wait_leader_ready(30)
        ready = time.perf_counter() - begin
        recovery = dict(broker.recovery)
    finally:
        await broker.stop()
    return {"start_s": started, "ready_s": ready, "recovery": recovery}


def measure(config: BrokerConfig, rounds: int, cold: bool) -> dict[str, object]:
    runs = []
    for _ in range(rounds):
        if cold:
            cold = drop_page_cache()
        # A new raft port each round: the last one may linger in TIME_WAIT.
        fresh = broker_config(config.data_dir, config.segment_size_bytes // MIB)
        runs.append(run(start_once(fresh)))
    recovery = runs[-1]["recovery"]
    assert isinstance(recovery, dict)
    return {
        "start_s_median": round(statistics.median(float(r["start_s"]) for r in runs), 4),  # type: ignore[arg-type]
        "start_s_all": [round(float(r["start_s"]), 4) for r in runs],  # type: ignore[arg-type]
        "ready_s_median": round(statistics.median(float(r["ready_s"]) for r in runs), 4),  # type: ignore[arg-type]
        "recovery_s_median": round(statistics.median(
            float(r["recovery"]["seconds"]) for r in runs), 4),  # type: ignore[index]
        "replayed_entries": recovery["replayed_entries"],
        "restored_snapshot_index": recovery["snapshot_index"],
        "cold_cache": cold,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="1024,10240",
                        help="log sizes to build and start, MiB, comma-separated")
    parser.add_argument("--tail-mib", type=float, default=63.0,
                        help="log after the snapshot, MiB (default: just under the default "
                             "snapshot_interval_bytes)")
    parser.add_argument("--segment-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contrast", action="store_true",
                        help="also start the smallest log without its snapshot")
    parser.add_argument("--cold", action="store_true",
                        help="drop the page cache before each start (root; machine-wide)")
    parser.add_argument("--dir", default=None, help="where to build (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",") if s.strip()]
    root = Path(args.dir or tempfile.mkdtemp(prefix="lmq-startup-"))
    root.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for size in sizes:
            data_dir = str(root / f"log-{size}mib")
            config = broker_config(data_dir, args.segment_mib)
            figures: dict[str, object] = {"size_mib": size}
            figures.update(build(data_dir, config, size * MIB, int(args.tail_mib * MIB)))
            figures.update(measure(config, args.rounds, args.cold))
            if args.contrast and size == min(sizes):
                aside = root / "snapshots-aside"
                shutil.move(os.path.join(data_dir, "snapshots"), aside)
                whole = measure(config, 1, args.cold)
                figures["without_snapshot"] = {k: whole[k] for k in (
                    "start_s_median", "recovery_s_median", "replayed_entries")}
                shutil.move(aside, os.path.join(data_dir, "snapshots"))
            results.append(figures)
            print(json.dumps(figures), file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(data_dir)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    out: dict[str, object] = {"bench": "startup", "messages_per_entry": MESSAGES_PER_ENTRY,
                              "message_bytes": MESSAGE_BYTES, "tail_mib": args.tail_mib,
                              "rounds": args.rounds, "runs": results}
    if len(results) >= 2:
        small, large = results[0], results[-1]
        out["start_ratio_largest_to_smallest"] = round(
            float(large["start_s_median"]) / float(small["start_s_median"]), 3)  # type: ignore[arg-type]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
