"""Function calls per message on each server and the client: cProfile of the
leader, the followers and this process's SDK over exactly N acknowledged
sends, as JSON.

A 3-node group on loopback (flush and Raft timing as bench/produce.py's
`--raft defaults`), one client with the SDK's merging off (or on, `--merging`) sending 1 KiB
messages, W in flight. After a warm-up, the servers start cProfile on a
signal (bench/cprofile_hook/sitecustomize.py), the client sends N messages,
and the servers write their profiles. Call counts per message do not depend
on the host's speed or load, which CPU time on a shared 2-core VM does: they
are how a change to the per-message path is compared run against run.
Profiled time is inflated by the profiler (~1 µs per Python call) and is
given only to rank functions.

    python bench/profile_calls.py --window 1 --messages 3000 [--flush async] [--top 25]
        [--merging]   # the SDK merges the window into one request (its default)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledgermq.base import loop  # noqa: E402
from ledgermq.broker.launcher import LocalCluster, wait_leader  # noqa: E402
from ledgermq.client import Producer  # noqa: E402

BODY = b"x" * 1024
RAFT_DEFAULTS = {"tick_ms": 50, "election_timeout_ticks": 10, "heartbeat_interval_ticks": 1}
HOOK = Path(__file__).resolve().parent / "cprofile_hook"


def function_name(key: tuple[str, int, str]) -> str:
    """'handlers.py:_store_start', or '~:<built-in ...>' for C functions."""
    filename, _, name = key
    return f"{Path(filename).name}:{name}" if filename != "~" else f"~:{name}"


def summarize(path: Path, messages: int, top: int) -> dict[str, Any]:
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]  # untyped in typeshed
    calls = sum(v[1] for v in stats.values())
    python = sum(v[1] for k, v in stats.items() if k[0] != "~")
    total = sum(v[2] for v in stats.values())
    by_name: dict[str, list[float]] = {}
    for key, (_, ncalls, tottime, _, _) in stats.items():
        row = by_name.setdefault(function_name(key), [0, 0.0])
        row[0] += ncalls
        row[1] += tottime

    def rows(order: int) -> list[dict[str, Any]]:
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][order])[:top]
        return [{"function": name, "calls_per_msg": round(n / messages, 2),
                 "profiled_us_per_msg": round(t / messages * 1e6, 2)} for name, (n, t) in ranked]

    return {"calls_per_msg": round(calls / messages, 1),
            "python_calls_per_msg": round(python / messages, 1),
            "profiled_us_per_msg": round(total / messages * 1e6, 1),
            "top_by_time": rows(1), "top_by_calls": rows(0)}


async def send(producer: Producer, messages: int, window: int) -> float:
    left = messages

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await producer.send("bench", BODY)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(window)))
    return time.monotonic() - started


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    profiles = base / "profiles"
    profiles.mkdir()
    os.environ["LEDGERMQ_CPROFILE_DIR"] = str(profiles)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HOOK), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    cluster = LocalCluster(base / "cluster", settings={
        "flush": args.flush, "replicate": "sync", "segment_size_bytes": 64 << 20},
        raft=RAFT_DEFAULTS)
    cluster.start()
    try:
        await wait_leader(cluster)
        async with Producer([cluster.namesrv_address], coalesce=args.merging) as producer:
            await producer.create_topic("bench", queues=8)
            await send(producer, args.warmup, args.window)
            leader = await wait_leader(cluster)
            pids = {"leader": cluster.brokers[leader].proc.pid}
            # Both followers: with reserves (docs/raft.md) one gets each
            # entry at once, the other in batches, and their costs differ.
            followers = [child.proc.pid for nid, child in sorted(cluster.brokers.items())
                         if nid != leader]
            for k, pid in enumerate(followers, 1):
                pids[f"follower_{k}"] = pid
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            client = cProfile.Profile()
            client.enable()
            seconds = await send(producer, args.messages, args.window)
            client.disable()
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR2)
            client.dump_stats(str(profiles / "client.prof"))
        out: dict[str, Any] = {"bench": "profile_calls", "window": args.window,
                               "messages": args.messages, "flush": args.flush,
                               "merging": args.merging,
                               "msgs_per_s_profiled": round(args.messages / seconds)}
        for name, pid in pids.items():
            path = profiles / f"{pid}.prof"
            deadline = time.monotonic() + 30
            while not path.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.2)  # written by dump_stats in one go; let it finish
            out[name] = summarize(path, args.messages, args.top)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, args.keep / f"{name}.prof")
        if args.keep is not None:
            shutil.copyfile(profiles / "client.prof", args.keep / "client.prof")
        out["client"] = summarize(profiles / "client.prof", args.messages, args.top)
        return out
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=1, help="sends in flight")
    parser.add_argument("--messages", type=int, default=3000, help="sends profiled")
    parser.add_argument("--warmup", type=int, default=2000, help="sends before profiling")
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    parser.add_argument("--merging", action="store_true",
                        help="the SDK merges concurrent sends into one request")
    parser.add_argument("--top", type=int, default=25, help="functions listed per ranking")
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the raw profiles here (leader.prof, follower_1.prof, "
                             "client.prof) for pstats: callers, callees")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-profile-calls-") as base:
        print(json.dumps(loop.run(run(args, Path(base))), indent=2))


if __name__ == "__main__":
    main()
