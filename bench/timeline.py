"""Where a W=1 round trip's time goes, as JSON: each stage of a send from the
client through the leader, its quick follower and back, from timestamps
taken in every process (bench/timeline_hook/sitecustomize.py).

A 3-node group on loopback (flush and Raft timing as bench/produce.py's
`--raft defaults`), one client with the SDK's merging off sending 1 KiB
messages one at a time. After a warm-up every process records N sends; each
send is then chained through the first matching event of each process:

    client write -> leader reads the request -> leader writes the append ->
    a follower reads it -> that follower writes its acknowledgement ->
    leader reads it -> leader writes the answer -> client reads it

A hop (`..._to_...`) runs from the start of the sender's write to the
start of the receiver's read: the write system call (which, on a VM, wakes
the receiver's vCPU) and the receiver's wake-up. A stage inside a process
runs from its read to its next write. `leader_ack_pass` and
`follower_append_pass` give the steps of those passes as median offsets
from the read (µs): where inside a pass the time goes. Stamps cost about
half a microsecond each, so the figures run a little slower than
bench/produce.py's; medians over the N sends.

    python bench/timeline.py [--messages 3000] [--flush async] [--busy-poll-us N]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import importlib.util
import json
import os
import pickle
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledgermq.base import loop  # noqa: E402
from ledgermq.broker.launcher import LocalCluster, wait_leader  # noqa: E402
from ledgermq.client import Producer  # noqa: E402

BODY = b"x" * 1024
RAFT_DEFAULTS = {"tick_ms": 50, "election_timeout_ticks": 10, "heartbeat_interval_ticks": 1}
HOOK = Path(__file__).resolve().parent / "timeline_hook"

Events = list[tuple[int, str]]


def load_hook() -> ModuleType:
    """The hook, in this process too (the client's side), under its own name."""
    spec = importlib.util.spec_from_file_location("timeline_hook", HOOK / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Track:
    """One process's events, searchable by time."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.times = [t for t, _ in events]

    def next(self, label: str, after: int) -> int | None:
        """The first `label` at or after `after` (ns)."""
        i = bisect.bisect_left(self.times, after)
        for t, lab in self.events[i:]:
            if lab == label:
                return t
        return None

    def offsets(self, start: int, end: int) -> dict[str, float]:
        """Each label's first time in [start, end], µs after `start`."""
        i = bisect.bisect_left(self.times, start)
        seen: dict[str, float] = {}
        for t, lab in self.events[i:]:
            if t > end:
                break
            seen.setdefault(lab, (t - start) / 1000)
        return seen


STAGES = ("client_send", "client_to_leader", "leader_request", "leader_to_follower",
          "follower_append", "follower_to_leader", "leader_ack", "leader_to_client",
          "client_answer")


def chain(sends: list[tuple[int, int]], tracks: dict[str, Track]) -> dict[str, Any]:
    """Every send's stages (µs) and the passes' steps: medians."""
    stages: dict[str, list[float]] = {k: [] for k in (*STAGES, "round_trip")}
    passes: dict[str, dict[str, list[float]]] = {"leader_ack_pass": {},
                                                 "follower_append_pass": {}}
    client, leader = tracks["client"], tracks["leader"]
    followers = [tracks[k] for k in tracks if k.startswith("follower")]
    for started, ended in sends:
        c_out = client.next("answer_out", started)
        l_in = c_out and leader.next("request_in", c_out)
        l_out = l_in and leader.next("peer_out", l_in)
        if not l_out:
            continue
        reads = [(t, f) for f in followers if (t := f.next("frame_in", l_out))]
        if not reads:
            continue
        f_in, follower = min(reads, key=lambda r: r[0])
        f_out = follower.next("peer_out", f_in)
        l_ack = f_out and leader.next("frame_in", f_out)
        l_ans = l_ack and leader.next("answer_out", l_ack)
        c_in = l_ans and client.next("frame_in", l_ans)
        if not (c_in and c_in <= ended):
            continue
        points = [started, c_out, l_in, l_out, f_in, f_out, l_ack, l_ans, c_in, ended]
        for name, a, b in zip(STAGES, points, points[1:], strict=False):
            stages[name].append((b - a) / 1000)
        stages["round_trip"].append((ended - started) / 1000)
        for key, track, a, b in (("leader_ack_pass", leader, l_ack, l_ans),
                                 ("follower_append_pass", follower, f_in, f_out)):
            for label, at in track.offsets(a, b).items():
                passes[key].setdefault(label, []).append(at)
    chained = len(stages["round_trip"])
    out: dict[str, Any] = {"sends_chained": chained}
    out["stages_us"] = {k: round(statistics.median(v), 1) for k, v in stages.items() if v}
    for key, labels in passes.items():
        # Steps seen in most passes, in the order they happen.
        common = {lab: statistics.median(v) for lab, v in labels.items() if len(v) > chained / 2}
        out[key] = {lab: round(at, 1) for lab, at in sorted(common.items(), key=lambda kv: kv[1])}
    return out


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    folder = base / "timelines"
    folder.mkdir()
    os.environ["LEDGERMQ_TIMELINE_DIR"] = str(folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HOOK), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    hook = load_hook()  # the client's stamps, in this process
    settings: dict[str, Any] = {"flush": args.flush, "replicate": "sync",
                                "segment_size_bytes": 64 << 20}
    if args.busy_poll_us is not None:
        settings["busy_poll_us"] = args.busy_poll_us
    cluster = LocalCluster(base / "cluster", settings=settings, raft=RAFT_DEFAULTS)
    cluster.start()
    try:
        await wait_leader(cluster)
        async with Producer([cluster.namesrv_address], coalesce=False) as producer:
            await producer.create_topic("bench", queues=8)
            for _ in range(args.warmup):
                await producer.send("bench", BODY)
            leader = await wait_leader(cluster)
            pids = {"leader": cluster.brokers[leader].proc.pid}
            others = [c.proc.pid for n, c in sorted(cluster.brokers.items()) if n != leader]
            for k, pid in enumerate(others, 1):
                pids[f"follower_{k}"] = pid
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            sends: list[tuple[int, int]] = []
            hook.start()
            began = time.perf_counter()
            for _ in range(args.messages):
                started = time.perf_counter_ns()
                await producer.send("bench", BODY)
                sends.append((started, time.perf_counter_ns()))
            seconds = time.perf_counter() - began
            hook.stop()
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR2)
        tracks = {"client": Track(hook.events)}
        for name, pid in pids.items():
            path = folder / f"{pid}.timeline"
            deadline = time.monotonic() + 30
            while not path.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.2)  # written in one go; let it finish
            with path.open("rb") as raw:
                tracks[name] = Track(pickle.load(raw))
        return {"bench": "timeline", "flush": args.flush, "messages": args.messages,
                "busy_poll_us": args.busy_poll_us,
                "msgs_per_s": round(args.messages / seconds), **chain(sends, tracks)}
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000, help="sends recorded")
    parser.add_argument("--warmup", type=int, default=2000, help="sends before recording")
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    parser.add_argument("--busy-poll-us", type=int, default=None,
                        help="the brokers' busy_poll_us (default: the broker's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-timeline-") as base:
        print(json.dumps(loop.run(run(args, Path(base))), indent=2))


if __name__ == "__main__":
    main()
