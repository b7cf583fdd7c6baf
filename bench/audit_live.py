"""Does a broker under load slow down while the live audit reads its files?

Issue 20's evidence: "a broker under load must not slow by more than 10%
while it is audited". A 3-node group on 127.0.0.1 (real processes, admin
apps on, flush and replicate `sync` as deployed), filled with `--messages`
messages first so that the audit has work. Then for each load, in
`--rounds` rounds and for each `--priorities` setting (the audit's CPU and
I/O priority, as `ledgermq audit schedule --priority` starts it:
audit_schedule.spawn):

  fixed rate   a producer at `--rate` messages/s, well below saturation (open
               loop: each send is scheduled at its time and its latency
               counted from then, so a stall shows as latency, not as fewer
               sends);
  saturation   `--in-flight` sends in a closed loop (each sends again as soon
               as it is acknowledged): the most the group acknowledges.

**Duty cycle.** The machine this runs on is shared: other users' load
moves a broker's latency by tens of percent from one minute to the next,
more than the effect measured. So the audit is not compared with a window
before or after it: while the load runs, the audit's processes (every
process of its session: the driver, the JVM, the Python workers, which
PySpark puts in a process group of their own) are stopped and continued
every `--slice` seconds (SIGSTOP/SIGCONT), and each send counts for the
slice it was sent in, `on` (the audit running) or `off` (stopped; 0.25 s
after each switch left out). Both conditions share the same minutes, and
the ratio on/off is the audit's effect. The audit runs from its start (the
JVM start included) to its exit, so it takes about twice its own time; a
stopped process cannot hold a file system lock across the stop (it stops
only on its way back to user space). A **control** round does the same
with no audit (the slices alternate, nothing is stopped): its ratios are
the method's noise floor. At saturation the audit is stopped for good
after `--saturation-seconds` (at idle priority a saturated machine gives it
little CPU).

The audit is `ledgermq audit --live URL... --master local[2]` over the live
data directories: the live cut is captured from the brokers' admin APIs at
its start, then Spark reads the files up to it while the brokers keep
writing. Printed (JSON): per load and priority the throughput and the
p50/p99 latency with the audit on and off, their ratios (per round and
pooled), the audit's wall time, its CPU (all its processes) and disk
traffic, whether it passed, and the machine's CPU use by everyone in the on
and off slices.

    .venv/bin/python bench/audit_live.py [--messages 200000] [--rate 800]
        [--rounds 2] [--priorities idle,normal] [--slice 2] [--cpus 0/1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
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


def session_pids(sid: int) -> list[int]:
    """Every live process of session `sid` (the audit's, audit_schedule.spawn)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    pids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def usage(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds, bytes read from and written to storage) of one process."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    except (OSError, ValueError):
        return None
    return ((int(stat[11]) + int(stat[12])) / tick, int(io["read_bytes"]),
            int(io["write_bytes"]))


@dataclass
class Samples:
    """Every acknowledged send: (sent or due, latency, acknowledged at)."""

    sends: list[tuple[float, float, float]] = field(default_factory=list)
    failed: int = 0


async def fixed_rate(producer: Producer, rate: float, body: bytes, done: asyncio.Event,
                     into: Samples, max_in_flight: int = 2000) -> None:
    """Sends scheduled at `rate`/s until `done`; latency from each send's
    scheduled time (open loop: a slow broker makes latency, not fewer sends)."""
    tasks: set[asyncio.Task[None]] = set()
    gate = asyncio.Semaphore(max_in_flight)

    async def one(due: float) -> None:
        try:
            await producer.send(TOPIC, body)
            now = time.monotonic()
            into.sends.append((due, now - due, now))
        except Exception:  # counted: a failed send in a benchmark is a figure
            into.failed += 1
        finally:
            gate.release()

    start = time.monotonic()
    sent = 0
    while not done.is_set():
        due_count = int((time.monotonic() - start) * rate) + 1
        while sent < due_count:
            await gate.acquire()
            task = asyncio.ensure_future(one(start + sent / rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(min(0.002, max(0.0, start + sent / rate - time.monotonic())))
    if tasks:
        await asyncio.gather(*tasks)


async def closed_loop(producer: Producer, in_flight: int, body: bytes, done: asyncio.Event,
                      into: Samples) -> None:
    """`in_flight` senders, each sending again as soon as it is acknowledged."""
    async def worker() -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                await producer.send(TOPIC, body)
            except Exception:
                into.failed += 1
                continue
            now = time.monotonic()
            into.sends.append((started, now - started, now))

    await asyncio.gather(*(worker() for _ in range(in_flight)))


@dataclass
class Phase:
    start: float
    end: float
    on: bool
    busy: float  # the machine's busy core-seconds in it (everyone's)


GUARD_S = 0.25  # left out after each switch


def split(samples: Samples, phases: list[Phase], closed: bool) -> dict[str, dict[str, Any]]:
    """The load's figures in the `on` and in the `off` phases. Throughput:
    acknowledgements in the phase (closed loop) or sends due in it that were
    acknowledged (open loop), per second of phase."""
    out = {}
    for state in (True, False):
        spans = [(ph.start + GUARD_S, ph.end) for ph in phases if ph.on == state
                 and ph.end > ph.start + GUARD_S]
        seconds = sum(b - a for a, b in spans)

        def inside(t: float, spans: list[tuple[float, float]] = spans) -> bool:
            return any(a <= t < b for a, b in spans)

        lat = [lat for t0, lat, _ in samples.sends if inside(t0)]
        acked = (sum(1 for _, _, t1 in samples.sends if inside(t1)) if closed else len(lat))
        busy = sum(ph.busy for ph in phases if ph.on == state)
        total = sum(ph.end - ph.start for ph in phases if ph.on == state)
        out["on" if state else "off"] = {
            "seconds": round(seconds, 1), "acked": acked,
            "msgs_per_s": round(acked / seconds, 1) if seconds else 0.0,
            "p50_ms": round(percentile(lat, 0.5) * 1000, 2),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
            "machine_busy_cores": round(busy / total, 2) if total else 0.0}
    return out


def ratios(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float | None]:
    def r(key: str) -> float | None:
        return round(on[key] / off[key], 3) if off[key] else None

    return {"throughput": r("msgs_per_s"), "p50": r("p50_ms"), "p99": r("p99_ms")}


class Audit:
    """The audit as `ledgermq audit schedule` starts it (audit_schedule.spawn):
    its own session, at a priority; stopped and continued as a whole."""

    def __init__(self, command: list[str], priority: str, out: Path,
                 env: dict[str, str] | None = None, cpus: set[int] | None = None) -> None:
        self.command = command
        self.priority = priority
        self.out = out
        self.env = env
        self.cpus = cpus
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.wall = 0.0
        self.usage: dict[int, tuple[float, int, int]] = {}
        self.exit: int | None = None
        self.stopped_for_good = False

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        own = os.sched_getaffinity(0)
        with open(self.out / "audit.log", "wb") as log:
            self.started = time.monotonic()
            # The affinity of the thread that forks is the child's, and every
            # process of the audit (its JVM, the Python workers) inherits it.
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)
            try:
                self.proc = spawn(self.command, self.priority, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=self.env)
            finally:
                os.sched_setaffinity(0, own)

    def running(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is None

    def sample(self) -> None:
        assert self.proc is not None
        for pid in session_pids(self.proc.pid):
            figures = usage(pid)
            if figures is not None:
                self.usage[pid] = figures

    def signal(self, sig: int) -> None:
        """`sig` to every process of the audit's session."""
        assert self.proc is not None
        for pid in session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        """For good: continued, then SIGTERM to its process group (the JVM;
        PySpark's workers leave with it), SIGKILL to what is left."""
        assert self.proc is not None
        self.stopped_for_good = True
        self.signal(signal.SIGCONT)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def finish(self) -> None:
        assert self.proc is not None
        self.exit = self.proc.wait()
        self.wall = time.monotonic() - self.started

    def summary(self) -> dict[str, Any]:
        verdict: dict[str, Any] | None = None
        try:
            summary = json.loads((self.out / "summary.json").read_text())
            verdict = {"valid": summary["valid"],
                       "cut": [g["window"]["cut"] for g in summary["groups"]]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if self.exit not in (0, None) and verdict is None and not self.stopped_for_good:
            # Why it left no summary: the last line naming an error.
            lines = (self.out / "audit.log").read_text(errors="replace").splitlines()
            verdict = {"error": next((line.strip()[:300] for line in reversed(lines)
                                      if "Error" in line or "error" in line), "")}
        return {"wall_s": round(self.wall, 2), "exit": self.exit,
                "stopped_at_window_end": self.stopped_for_good,
                "cpu_s": round(sum(u[0] for u in self.usage.values()), 2),
                "disk_read_mb": round(sum(u[1] for u in self.usage.values()) / 1e6, 1),
                "disk_written_mb": round(sum(u[2] for u in self.usage.values()) / 1e6, 1),
                "result": verdict}


async def duty_cycle(audit: Audit | None, slice_s: float, limit: float, done: asyncio.Event,
                     control_s: float) -> list[Phase]:
    """Alternate on and off phases of `slice_s` until the audit exits (or
    `limit` seconds: it is stopped), or for `control_s` without an audit;
    then set `done`."""
    phases: list[Phase] = []
    start = time.monotonic()
    on = True
    while True:
        t0, busy0 = time.monotonic(), machine_busy()[0]
        end = t0 + slice_s
        while time.monotonic() < end:
            if audit is not None:
                audit.sample()
                if not audit.running():
                    break
            await asyncio.sleep(0.05)
        phases.append(Phase(t0, time.monotonic(), on, machine_busy()[0] - busy0))
        elapsed = time.monotonic() - start
        if audit is None:
            if elapsed >= control_s:
                break
        elif not audit.running():
            break
        elif elapsed >= limit:
            audit.stop()
            break
        on = not on
        if audit is not None:
            audit.signal(signal.SIGCONT if on else signal.SIGSTOP)
    if audit is not None:
        audit.finish()
    done.set()
    return phases


def cpu_sets(parser: argparse.ArgumentParser, spec: str
             ) -> tuple[set[int] | None, set[int] | None]:
    """``--cpus BROKERS/AUDIT`` (comma-separated CPU numbers on each side) as two sets."""
    if not spec:
        return None, None
    try:
        sides = [{int(c) for c in side.split(",")} for side in spec.split("/")]
    except ValueError:
        sides = []
    usable = os.sched_getaffinity(0)
    if (len(sides) != 2 or not all(sides) or sides[0] & sides[1]
            or not sides[0] | sides[1] <= usable):
        parser.error(f"--cpus {spec!r}: two disjoint sets of this machine's CPUs "
                     f"{sorted(usable)}, e.g. 0/1")
    return sides[0], sides[1]


class Bench:
    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.base = base
        self.args = args
        self.body = b"m" * args.msg_size
        # No broker-state snapshots (hence no retention) while measuring: a
        # newer snapshot deletes the older one, and an audit that meets a
        # vanished file lists again and starts over (docs/audit.md, "Files
        # that change under the audit"), which would measure that restart
        # as well; what this measures is the audit's load.
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
        return Audit(command, priority, out, env, self.args.audit_cpus)

    async def measure(self, load: str, priority: str | None) -> dict[str, Any]:
        """One round: the load with the audit duty-cycled (None: the control)."""
        assert self.producer is not None
        samples = Samples()
        done = asyncio.Event()
        if load == "fixed_rate":
            runner = fixed_rate(self.producer, self.args.rate, self.body, done, samples)
            limit = self.args.audit_limit
        else:
            runner = closed_loop(self.producer, self.args.in_flight, self.body, done, samples)
            limit = self.args.saturation_seconds
        audit = self.audit(priority) if priority is not None else None
        if audit is not None:
            audit.start()
        load_task = asyncio.ensure_future(runner)
        phases = await duty_cycle(audit, self.args.slice, limit, done, self.args.control_seconds)
        await load_task
        figures = split(samples, phases, closed=load == "saturation")
        result = {**figures, "ratio": ratios(figures["on"], figures["off"]),
                  "failed_sends": samples.failed}
        if audit is not None:
            result["audit"] = audit.summary()
        return result

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.close()
        await asyncio.to_thread(self.cluster.stop)
        if self.args.spark_local_dir:
            for scratch in Path(self.args.spark_local_dir).glob(f"spark-{os.getpid()}-*"):
                shutil.rmtree(scratch, ignore_errors=True)


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' on and off figures together (seconds-weighted throughput,
    the median of the rounds' latencies)."""
    out: dict[str, Any] = {}
    for state in ("on", "off"):
        rs = [r[state] for r in rounds]
        seconds = sum(r["seconds"] for r in rs)
        out[state] = {"seconds": round(seconds, 1),
                      "msgs_per_s": round(sum(r["acked"] for r in rs) / seconds, 1)
                      if seconds else 0.0,
                      "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 2),
                      "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 2)}
    out["ratio"] = ratios(out["on"], out["off"])
    return out


async def main(args: argparse.Namespace) -> None:
    if args.broker_cpus:
        # This process (the producer) and every process it starts (the
        # NameServer, the brokers) run there; the audit on `audit_cpus`.
        os.sched_setaffinity(0, args.broker_cpus)
    base = Path(tempfile.mkdtemp(prefix="ledgermq-audit-live-"))
    priorities = [p for p in args.priorities.split(",") if p]
    result: dict[str, Any] = {
        "bench": "audit_live", "nodes": 3, "flush": "sync", "replicate": "sync",
        "messages_prefilled": args.messages, "message_bytes": args.msg_size,
        "rate": args.rate, "in_flight": args.in_flight, "master": args.master,
        "slice_s": args.slice, "rounds": args.rounds,
        "spark_local_dir": args.spark_local_dir or "/tmp", "cpus": os.cpu_count(),
        "broker_cpus": sorted(args.broker_cpus or []), "audit_cpus": sorted(args.audit_cpus or []),
        "load_average_start": os.getloadavg()}
    bench = Bench(base, args)
    try:
        t0 = time.monotonic()
        await bench.start()
        result["prefill_s"] = round(time.monotonic() - t0, 1)
        result["data_bytes_per_replica"] = sum(
            f.stat().st_size for f in (base / "cluster" / "n1").rglob("*") if f.is_file())
        for load in args.loads.split(","):
            figures: dict[str, Any] = {"control": await bench.measure(load, None)}
            print(json.dumps({"load": load, "control": figures["control"]}), file=sys.stderr,
                  flush=True)
            for r in range(args.rounds):
                # The priorities take turns, so a drift of the machine's speed
                # falls on each alike.
                turn = r % len(priorities)
                for priority in priorities[turn:] + priorities[:turn]:
                    one = await bench.measure(load, priority)
                    figures.setdefault(priority, {"rounds": []})["rounds"].append(one)
                    print(json.dumps({"load": load, "priority": priority, "round": r, **one}),
                          file=sys.stderr, flush=True)
            for priority in priorities:
                figures[priority].update(pooled(figures[priority]["rounds"]))
            result[load] = figures
    finally:
        await bench.stop()
        shutil.rmtree(base, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages written before the measurements (the audit's data)")
    parser.add_argument("--msg-size", type=int, default=256)
    parser.add_argument("--segment-mb", type=int, default=64, help="segment_size_bytes in MiB")
    parser.add_argument("--loads", default="fixed_rate,saturation",
                        help="comma separated: fixed_rate, saturation")
    parser.add_argument("--rate", type=float, default=800.0,
                        help="offered messages/s of the fixed-rate load")
    parser.add_argument("--in-flight", type=int, default=64,
                        help="concurrent sends of the saturation load")
    parser.add_argument("--slice", type=float, default=2.0,
                        help="seconds of each on and off phase of the duty cycle")
    parser.add_argument("--saturation-seconds", type=float, default=40.0,
                        help="how long a saturation round lasts (the audit is stopped then)")
    parser.add_argument("--audit-limit", type=float, default=900.0,
                        help="stop an audit of the fixed-rate load after this long")
    parser.add_argument("--control-seconds", type=float, default=40.0,
                        help="length of the control round (no audit)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--priorities", default="idle,normal",
                        help=f"comma separated, of: {', '.join(PRIORITIES)}")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--spark-local-dir", default="",
                        help="Spark's scratch directory for the audit (e.g. a tmpfs: /dev/shm)"
                             "; default: Spark's, under /tmp")
    parser.add_argument("--cpus", default="", metavar="BROKERS/AUDIT",
                        help="pin the brokers and the producer to one set of CPUs and the audit"
                             " to another, e.g. 0/1 (the executors off the brokers' cores, as"
                             " docs/audit.md recommends); default: no pinning")
    parsed = parser.parse_args()
    parsed.broker_cpus, parsed.audit_cpus = cpu_sets(parser, parsed.cpus)
    bad = (set(parsed.priorities.split(",")) - set(PRIORITIES)) | (
        set(parsed.loads.split(",")) - {"fixed_rate", "saturation"})
    if bad or parsed.rounds < 1 or parsed.rate <= 0 or parsed.slice <= 2 * GUARD_S:
        parser.error(f"unknown {sorted(bad)}; --rounds >= 1, --rate > 0, --slice > 0.5")
    loop.run(main(parsed))
