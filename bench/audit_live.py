"""Does a broker under load slow down while the live audit reads its files?

Issue 20's evidence: "a broker under load must not slow by more than 10%
while it is audited". A 3-node group on 127.0.0.1 (real processes, admin
apps on, flush and replicate `sync` as deployed), filled with `--messages`
messages first so the audit has work; then, in `--rounds` rounds and for
each `--priorities` setting (the audit's CPU and I/O priority, as
`ledgermq audit schedule --priority` runs it):

  fixed rate   a producer at `--rate` messages/s (open loop: each send is
               scheduled at its time, its latency counted from then, so a
               stall shows as latency, not as fewer sends), well below
               saturation; a window while the audit runs (from its start to
               its exit: JVM start included) between two windows without it
               (the baseline: both pooled, so a drift of the shared machine's
               speed falls on both sides);
  saturation   `--in-flight` sends in a closed loop, three windows of
               `--saturation-seconds`, the audit started at the middle one's
               start (and stopped at its end if not done: at idle priority a
               saturated machine gives it little).

The audit is `ledgermq audit --live URL... --master local[2]` over the live
data directories: the live cut is captured from the brokers' admin APIs at
its start, then Spark reads the files up to it while the brokers keep
writing. Printed (JSON): per priority and load the achieved throughput and
the p50/p99 latency with and without the audit, their ratios (audited /
quiet) per round and pooled, the audit's wall time, its CPU (all its
processes) and whether it passed; the machine's CPU use by everyone (the
machine is shared: other users' load shows up as noise in both windows).

    .venv/bin/python bench/audit_live.py [--messages 400000] [--rate 800]
        [--rounds 3] [--priorities idle,normal] [--saturation-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, wait_admin_url, wait_leader
from ledgermq.cli.audit_schedule import spawn
from ledgermq.client import Producer

TOPIC = "live"
PRIORITIES = ("idle", "nice", "normal")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def group_usage(pgid: int, seen: dict[int, tuple[float, int, int]]) -> None:
    """Record (CPU seconds, bytes read from and written to storage) of every
    live process of group `pgid` (the audit: its Python driver, the JVM, the
    Python workers) into `seen`."""
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) != pgid:  # field 5, pgrp
                continue
            io = dict(line.split(": ") for line in (entry / "io").read_text().splitlines())
        except (OSError, ValueError):
            continue
        seen[int(entry.name)] = ((int(stat[11]) + int(stat[12])) / tick,
                                 int(io["read_bytes"]), int(io["write_bytes"]))


@dataclass
class Window:
    """One measured window of the load."""

    seconds: float = 0.0
    acked: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    busy: float = 0.0  # the machine's busy core-seconds during it

    def summary(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 2), "acked": self.acked, "failed": self.failed,
                "msgs_per_s": round(self.acked / self.seconds, 1) if self.seconds else 0.0,
                "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
                "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2),
                "machine_busy_cores": round(self.busy / self.seconds, 2)
                if self.seconds else 0.0}


async def fixed_rate(producer: Producer, rate: float, body: bytes, done: asyncio.Event,
                     max_in_flight: int = 2000) -> Window:
    """Sends scheduled at `rate`/s until `done`; latency from each send's
    scheduled time (open loop: a slow broker makes latency, not fewer sends)."""
    win = Window()
    tasks: set[asyncio.Task[None]] = set()
    gate = asyncio.Semaphore(max_in_flight)

    async def one(due: float) -> None:
        try:
            await producer.send(TOPIC, body)
            win.latencies.append(time.monotonic() - due)
            win.acked += 1
        except Exception:  # counted: a failed send in a benchmark is a figure
            win.failed += 1
        finally:
            gate.release()

    busy0, _ = machine_busy()
    start = time.monotonic()
    sent = 0
    while not done.is_set():
        now = time.monotonic()
        due_count = int((now - start) * rate) + 1
        while sent < due_count:
            await gate.acquire()
            task = asyncio.ensure_future(one(start + sent / rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(min(0.002, max(0.0, start + sent / rate - time.monotonic())))
    win.seconds = time.monotonic() - start
    if tasks:
        await asyncio.gather(*tasks)
    win.busy = machine_busy()[0] - busy0
    return win


async def closed_loop(producer: Producer, in_flight: int, body: bytes, seconds: float
                      ) -> Window:
    """`in_flight` senders, each sending as soon as the previous send is acknowledged."""
    win = Window()
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                await producer.send(TOPIC, body)
            except Exception:
                win.failed += 1
                continue
            win.latencies.append(time.monotonic() - started)
            win.acked += 1

    busy0, _ = machine_busy()
    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    win.seconds = time.monotonic() - start
    win.busy = machine_busy()[0] - busy0
    return win


class Audit:
    """The audit as a child process in its own session, at a priority, as
    `ledgermq audit schedule` starts it (audit_schedule.spawn)."""

    def __init__(self, command: list[str], priority: str, out: Path,
                 env: dict[str, str] | None = None) -> None:
        self.command = command
        self.priority = priority
        self.env = env
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.wall = 0.0
        self.usage: dict[int, tuple[float, int, int]] = {}
        self.exit: int | None = None

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        log = open(self.out / "audit.log", "wb")  # noqa: SIM115 (kept by the child)
        self.started = time.monotonic()
        self.proc = spawn(self.command, self.priority, stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=self.env)
        log.close()

    async def wait(self, done: asyncio.Event, limit: float | None = None) -> None:
        """Until the audit exits (or `limit` seconds: then it is stopped); sets `done`."""
        assert self.proc is not None
        while self.proc.poll() is None:
            group_usage(self.proc.pid, self.usage)
            if limit is not None and time.monotonic() - self.started >= limit:
                self.stop()
                break
            await asyncio.sleep(0.25)
        self.wall = time.monotonic() - self.started
        self.exit = self.proc.wait()
        done.set()

    def stop(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def summary(self) -> dict[str, Any]:
        verdict = None
        try:
            summary = json.loads((self.out / "summary.json").read_text())
            verdict = {"valid": summary["valid"],
                       "committed_index": [g["committed_index"] for g in summary["groups"]]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if self.exit not in (0, None) and verdict is None:
            # Why it left no summary: the last line naming an error.
            lines = (self.out / "audit.log").read_text(errors="replace").splitlines()
            verdict = {"error": next((line.strip()[:300] for line in reversed(lines)
                                      if "Error" in line or "error" in line), "")}
        return {"wall_s": round(self.wall, 2), "exit": self.exit,
                "cpu_s": round(sum(u[0] for u in self.usage.values()), 2),
                "disk_read_mb": round(sum(u[1] for u in self.usage.values()) / 1e6, 1),
                "disk_written_mb": round(sum(u[2] for u in self.usage.values()) / 1e6, 1),
                "result": verdict}


class Bench:
    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.base = base
        self.args = args
        self.body = b"m" * args.msg_size
        # No broker-state snapshots (hence no retention) while measuring: a
        # newer snapshot deletes the older one, and an audit that lists a
        # file and then finds it gone fails today (docs/audit.md, "Auditing
        # a live deployment"); what this measures is the audit's load.
        self.cluster = LocalCluster(base / "cluster", admin_listen="127.0.0.1:0", settings={
            "flush": "sync", "replicate": "sync", "segment_size_bytes": args.segment_mb << 20,
            "snapshot_interval_entries": 0, "snapshot_interval_bytes": 0})
        self.producer: Producer | None = None
        self.urls: list[str] = []
        self.audits = 0

    async def start(self) -> None:
        self.cluster.start()
        await wait_leader(self.cluster)
        self.urls = [await wait_admin_url(self.cluster, nid) for nid in sorted(self.cluster.peers)]
        self.producer = Producer([self.cluster.namesrv_address], retry_timeout=60.0)
        await self.producer.create_topic(TOPIC, queues=8)
        # Prefill: batches of 256, 8 in flight, so that the audit has work.
        left = self.args.messages

        async def filler() -> None:
            nonlocal left
            assert self.producer is not None
            while left > 0:
                n = min(256, left)
                left -= n
                await self.producer.send_batch(TOPIC, [self.body] * n)

        await asyncio.gather(*(filler() for _ in range(8)))

    def audit(self, priority: str) -> Audit:
        self.audits += 1
        out = self.base / f"audit-{self.audits}"
        nodes = ",".join(str(self.base / "cluster" / f"n{n}") for n in sorted(self.cluster.peers))
        command = [sys.executable, "-m", "ledgermq.cli", "audit",
                   *[a for url in self.urls for a in ("--live", url)],
                   "--master", self.args.master, "--driver-memory", "1g", "--no-progress",
                   "--out", str(out), f"broker-a={nodes}"]
        env = None
        if self.args.spark_local_dir:
            # Spark's scratch (shuffle blocks, spills) there instead of /tmp.
            scratch = Path(self.args.spark_local_dir) / f"spark-{os.getpid()}-{self.audits}"
            env = {**os.environ, "SPARK_LOCAL_DIRS": str(scratch)}
        return Audit(command, priority, out, env)

    async def fixed(self, priority: str, length: float) -> tuple[Window, list[Window], Audit]:
        """(audited window, [quiet window before, quiet window after], the
        audit) at the fixed rate: the audited window lasts as long as the
        audit, the quiet ones `length` (the previous audit's wall time) and
        as long as this audit. Quiet windows on both sides: a drift of the
        shared machine's speed falls on the baseline as on the audit."""
        assert self.producer is not None

        async def quiet(seconds: float) -> Window:
            done = asyncio.Event()
            asyncio.get_running_loop().call_later(seconds, done.set)
            return await fixed_rate(self.producer, self.args.rate, self.body, done)

        before = await quiet(length)
        done = asyncio.Event()
        audit = self.audit(priority)
        audit.start()
        waiter = asyncio.ensure_future(audit.wait(done, self.args.audit_limit))
        win = await fixed_rate(self.producer, self.args.rate, self.body, done)
        await waiter
        after = await quiet(audit.wall)
        return win, [before, after], audit

    async def saturated(self, priority: str) -> tuple[Window, list[Window], Audit]:
        """The same with the closed loop, every window `--saturation-seconds`
        long; the audit is stopped at the end of its window if not done."""
        assert self.producer is not None
        seconds = self.args.saturation_seconds
        before = await closed_loop(self.producer, self.args.in_flight, self.body, seconds)
        done = asyncio.Event()
        audit = self.audit(priority)
        audit.start()
        waiter = asyncio.ensure_future(audit.wait(done, seconds))
        win = await closed_loop(self.producer, self.args.in_flight, self.body, seconds)
        await waiter
        after = await closed_loop(self.producer, self.args.in_flight, self.body, seconds)
        return win, [before, after], audit

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.close()
        await asyncio.to_thread(self.cluster.stop)
        if self.args.spark_local_dir:
            for scratch in Path(self.args.spark_local_dir).glob(f"spark-{os.getpid()}-*"):
                shutil.rmtree(scratch, ignore_errors=True)


def ratios(audited: dict[str, Any], quiet: dict[str, Any]) -> dict[str, float | None]:
    def r(key: str) -> float | None:
        return round(audited[key] / quiet[key], 3) if quiet[key] else None

    return {"throughput": r("msgs_per_s"), "p50": r("p50_ms"), "p99": r("p99_ms")}


def pooled(windows: list[Window]) -> Window:
    out = Window()
    for w in windows:
        out.seconds += w.seconds
        out.acked += w.acked
        out.failed += w.failed
        out.latencies += w.latencies
        out.busy += w.busy
    return out


async def main(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="ledgermq-audit-live-"))
    priorities = [p for p in args.priorities.split(",") if p]
    result: dict[str, Any] = {
        "bench": "audit_live", "nodes": 3, "flush": "sync", "replicate": "sync",
        "messages_prefilled": args.messages, "message_bytes": args.msg_size,
        "rate": args.rate, "in_flight": args.in_flight, "master": args.master,
        "rounds": args.rounds, "spark_local_dir": args.spark_local_dir or "/tmp",
        "cpus": os.cpu_count(), "load_average_start": os.getloadavg()}
    bench = Bench(base, args)
    try:
        t0 = time.monotonic()
        await bench.start()
        result["prefill_s"] = round(time.monotonic() - t0, 1)
        result["data_bytes_per_replica"] = sum(
            f.stat().st_size for f in (base / "cluster" / "n1").rglob("*") if f.is_file())
        for load in ("fixed_rate", "saturation"):
            if load == "saturation" and args.saturation_seconds <= 0:
                continue
            figures: dict[str, Any] = {}
            kept: dict[str, tuple[list[Window], list[Window]]] = {p: ([], []) for p in priorities}
            length = 20.0
            for r in range(args.rounds):
                # The priorities take turns, so a drift of the machine's speed
                # falls on each alike.
                turn = r % len(priorities)
                for priority in priorities[turn:] + priorities[:turn]:
                    if load == "fixed_rate":
                        win, quiets, audit = await bench.fixed(priority, length)
                        length = audit.wall
                    else:
                        win, quiets, audit = await bench.saturated(priority)
                    kept[priority][0].append(win)
                    kept[priority][1].extend(quiets)
                    a, q = win.summary(), pooled(quiets).summary()
                    figures.setdefault(priority, {"rounds": []})["rounds"].append(
                        {"audited": a, "quiet_before": quiets[0].summary(),
                         "quiet_after": quiets[1].summary(), "ratio": ratios(a, q),
                         "audit": audit.summary()})
                    print(json.dumps({"load": load, "priority": priority, "round": r,
                                      "ratio": ratios(a, q), "audited": a, "quiet": q,
                                      "audit": audit.summary()}), file=sys.stderr, flush=True)
            for priority, (audited, quiet) in kept.items():
                a, q = pooled(audited).summary(), pooled(quiet).summary()
                figures[priority].update(audited=a, quiet=q, ratio=ratios(a, q))
            result[load] = figures
    finally:
        await bench.stop()
        shutil.rmtree(base, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000,
                        help="messages written before the measurements (the audit's data)")
    parser.add_argument("--msg-size", type=int, default=256)
    parser.add_argument("--segment-mb", type=int, default=64, help="segment_size_bytes in MiB")
    parser.add_argument("--rate", type=float, default=800.0,
                        help="offered messages/s of the fixed-rate load")
    parser.add_argument("--in-flight", type=int, default=64,
                        help="concurrent sends of the saturation load")
    parser.add_argument("--saturation-seconds", type=float, default=20.0,
                        help="length of each saturation window (0: no saturation load)")
    parser.add_argument("--audit-limit", type=float, default=600.0,
                        help="stop an audit of the fixed-rate load after this long")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--priorities", default="idle,normal",
                        help=f"comma separated, of: {', '.join(PRIORITIES)}")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--spark-local-dir", default="",
                        help="Spark's scratch directory for the audit (e.g. a tmpfs: /dev/shm)"
                             "; default: Spark's, under /tmp")
    parsed = parser.parse_args()
    bad = set(parsed.priorities.split(",")) - set(PRIORITIES)
    if bad or parsed.rounds < 1 or parsed.rate <= 0:
        parser.error(f"unknown priorities {sorted(bad)}; --rounds >= 1, --rate > 0")
    loop.run(main(parsed))
