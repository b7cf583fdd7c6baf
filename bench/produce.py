"""Produce benchmark: a 3-node group on loopback, 1 KiB messages, JSON out.

For flush = async and flush = sync (replicate = sync in both), and for each
security mode of `--security` (default all three, in the same run):
  open      no cluster secret, plain TCP (loopback only);
  auth      cluster secret + bootstrap admin: Raft peers, registrations and
            clients authenticate (docs/security.md); the producer is an ACL
            user with PUB on the topic, so every send passes an ACL check;
  auth+tls  the same with TLS on every port (a throwaway CA, chaos.security);

  (a) per-message sends, 64 in flight, and one at a time
      (`single_1_in_flight`: the SDK's default, merging on, at W = 1, as
      the side-by-side kit's W = 1 row sends);
  (b) batches of 64 messages (send_batch), 8 batches in flight, and again
      with 32 in flight (more producers' batches for the client to coalesce);
  (c) the per-message workload, as other systems' clients send: the SDK's
      merging off (`Producer(coalesce=False)`: every send its own request)
      with W = 1, 64 and 256 sends in flight, and `--procs` independent
      producer processes (bench/producer_procs.py) each sending one message
      at a time, so that only the broker's group commit batches;
acknowledged messages per second, per-request latency p50/p99, and the CPU
time each process (leader, followers, client or clients) spent per
acknowledged message, with the three servers' sum (`servers`) and, with
`--idle-seconds`, the same less each server's idle CPU over the slice. `--loads`
picks the loads, `--flush` the flush settings; `--profile DIR` records each
slice's leader and first follower with py-spy (collapsed stacks, summed by
bench/profile_top.py).
Then failover: SIGKILL the leader while a prober sends, time to the first
acknowledged send after the kill (it can only be on the new leader), over
`--kills` kills (the killed node is restarted, and every node has caught up
with the leader, before the next one); p50, max (open cluster only).

The security modes' clusters run side by side and each figure is measured
in `--rounds` slices, the modes taking turns in a rotating order, so a drift
of the machine's speed during the run falls on every mode alike; `cost`
gives, per flush and load, each secured mode against open: the throughput
ratio, the latency and the CPU microseconds per message it adds per process.

The client runs in this process, the NameServer and brokers in children: on a
2-core machine all of them share the CPUs, so the figures are for the whole
system on one box.

    .venv/bin/python bench/produce.py [--seconds 5] [--kills 10]
        [--security open,auth,auth+tls] [--rounds 3] [--flush async,sync]
        [--loads single_64_in_flight,...,procs] [--procs 64] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.producer_procs import ProducerProcesses
from chaos.security import OPEN, WORKLOAD_KEY, ClientSecurity, SecurityFiles, generate, put_user
from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, node_status, wait_leader
from ledgermq.client import Producer

BODY = b"x" * 1024
SECURITY_MODES = ("open", "auth", "auth+tls")
FLUSHES = ("async", "sync")


@dataclass(frozen=True)
class Load:
    batch: int  # messages per send call
    in_flight: int  # concurrent senders sharing one Producer
    coalesce: bool = True  # the SDK's client-side merging
    processes: bool = False  # --procs worker processes instead (one at a time each)


LOADS = {
    "single_64_in_flight": Load(1, 64),
    "single_1_in_flight": Load(1, 1),
    "batch_64": Load(64, 8),
    "batch_64_32_in_flight": Load(64, 32),
    "nomerge_w1": Load(1, 1, coalesce=False),
    "nomerge_w64": Load(1, 64, coalesce=False),
    "nomerge_w256": Load(1, 256, coalesce=False),
    "procs": Load(1, 1, coalesce=False, processes=True),
}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


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


SERVERS = ("leader", "follower_1", "follower_2")
# Raft timing of the clusters: None = the launcher's FAST; "defaults" as in
# docs/configuration.md (and the side-by-side kit's throughput runs).
RAFT: dict[str, dict[str, int] | None] = {
    "fast": None,
    "defaults": {"tick_ms": 50, "election_timeout_ticks": 10, "heartbeat_interval_ticks": 1}}


class Slices:
    """One figure measured in slices: acks, latencies and CPU seconds add up."""

    def __init__(self) -> None:
        self.acked = 0
        self.elapsed = 0.0
        self.latencies: list[float] = []
        self.cpu: dict[str, float] = {}
        self.system: dict[str, float] = {}  # the kernel's part of `cpu`
        # CPU cores each server process uses with no load (ticks,
        # heartbeats, timers), measured before the loads (--idle-seconds).
        self.idle: dict[str, float] = {}

    def add_cpu(self, before: dict[str, tuple[float, float]], processes: dict[str, int]) -> None:
        for name, pid in processes.items():
            user, system = cpu_split(pid)
            self.cpu[name] = self.cpu.get(name, 0.0) + user + system - sum(before[name])
            self.system[name] = self.system.get(name, 0.0) + system - before[name][1]

    def summary(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "msgs_per_s": round(self.acked / self.elapsed) if self.elapsed else 0,
            "acked": self.acked,
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2)}
        if self.cpu and self.acked:
            result["cpu_us_per_msg"] = {name: round(seconds / self.acked * 1e6, 1)
                                        for name, seconds in self.cpu.items()}
            servers = [s for name, s in self.cpu.items() if name in SERVERS]
            if servers:
                result["cpu_us_per_msg"]["servers"] = round(sum(servers) / self.acked * 1e6, 1)
            # How much of it the kernel spent (socket writes and reads, fsync).
            result["system_share"] = {name: round(self.system[name] / seconds, 2)
                                      for name, seconds in self.cpu.items()
                                      if name in self.system and seconds > 0}
            if self.idle:
                # Less what the process spends idle over the same time: at one
                # message in flight the ticks weigh as much as the messages, and
                # more the slower a crowded host lets the load run.
                net = {name: round((self.cpu[name] - cores * self.elapsed) / self.acked * 1e6, 1)
                       for name, cores in self.idle.items() if name in self.cpu}
                net["servers"] = round(sum(v for k, v in net.items() if k in SERVERS), 1)
                result["cpu_us_per_msg_less_idle"] = net
        return result


async def run_load(producer: Producer, seconds: float, batch: int, in_flight: int,
                   processes: dict[str, int] | None = None,
                   into: Slices | None = None) -> dict[str, Any]:
    """Acked msg/s and latency; with `processes` (name -> pid), also each
    one's CPU microseconds per acknowledged message. `into`: add this slice
    to a figure measured in several."""
    slices = into if into is not None else Slices()
    deadline = time.monotonic() + seconds
    acked = 0

    async def worker() -> None:
        nonlocal acked
        while time.monotonic() < deadline:
            started = time.monotonic()
            if batch == 1:
                await producer.send("bench", BODY)
            else:
                await producer.send_batch("bench", [BODY] * batch)
            slices.latencies.append(time.monotonic() - started)
            acked += batch

    processes = processes or {}
    cpu_before = {name: cpu_split(pid) for name, pid in processes.items()}
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    slices.elapsed += time.monotonic() - started
    slices.acked += acked
    slices.add_cpu(cpu_before, processes)
    return slices.summary()


async def run_processes(workers: ProducerProcesses, seconds: float, processes: dict[str, int],
                        into: Slices) -> None:
    """One slice of the independent producers: the servers' CPU around it,
    the workers' own CPU ("clients") and latencies from their reports."""
    cpu_before = {name: cpu_split(pid) for name, pid in processes.items()}
    reports = await workers.run(seconds)
    into.add_cpu(cpu_before, processes)
    into.cpu["clients"] = into.cpu.get("clients", 0.0) + sum(r["cpu_s"] for r in reports)
    into.elapsed += max(r["elapsed_s"] for r in reports)
    into.acked += sum(r["acked"] for r in reports)
    into.latencies += [ms / 1000 for r in reports for ms in r["latencies_ms"]]


class Profiler:
    """py-spy on some processes for one slice: collapsed stacks per process
    (idle threads left out, so samples follow CPU time)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.running: list[subprocess.Popen[bytes]] = []
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            if not Path(self.exe).exists():
                raise SystemExit("--profile needs py-spy (pip install py-spy)")

    def start(self, tag: str, pids: dict[str, int]) -> None:
        if self.directory is None:
            return
        for name, pid in pids.items():
            out = self.directory / f"{tag}-{name}.txt"
            self.running.append(subprocess.Popen(
                [self.exe, "record", "--pid", str(pid), "--rate", "200", "--nonblocking", "--gil",
                 "--format", "raw", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for proc in self.running:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        for proc in self.running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.running = []


class Bench:
    """One security mode's cluster, producers and processes for a flush setting."""

    def __init__(self, base: Path, flush: str, security: str, procs: int,
                 raft: dict[str, int] | None = None, idle_seconds: float = 0.0) -> None:
        self.security = security
        self.procs = procs
        self.idle_seconds = idle_seconds
        self.idle: dict[str, float] = {}
        settings: dict[str, Any] = {"flush": flush, "replicate": "sync",
                                    "segment_size_bytes": 64 << 20}
        self.client = OPEN
        self.worker_args: list[str] = []
        if security != "open":
            files: SecurityFiles = generate(base / f"security-{flush}-{security}",
                                            ["127.0.0.1", "localhost"])
            secured = files.broker_settings()
            if security == "auth":
                secured = {k: v for k, v in secured.items() if not k.startswith("tls_")}
            settings.update(secured)
            full = files.client()
            self.client = ClientSecurity(admin=full.admin, user=full.user,
                                         tls=full.tls if security == "auth+tls" else None)
            self.worker_args = ["--access-key", WORKLOAD_KEY,
                                "--secret-file", str(files.workload_secret_file)]
            if security == "auth+tls":
                self.worker_args += ["--ca-file", str(files.ca_file)]
        self.cluster = LocalCluster(base / f"tp-{flush}-{security.replace('+', '-')}",
                                    settings=settings, raft=raft)
        self.producer: Producer | None = None  # merging on
        self.single: Producer | None = None  # merging off
        self.workers: ProducerProcesses | None = None
        self.processes: dict[str, int] = {}

    async def start(self) -> None:
        self.cluster.start()
        await wait_leader(self.cluster)
        if self.client.secure:
            # The topic as the admin; the load as an ACL user that may publish to it.
            async with Producer([self.cluster.namesrv_address], credentials=self.client.admin,
                                tls=self.client.tls) as admin:
                await admin.create_topic("bench", queues=8)
            assert self.client.user is not None
            await put_user([self.cluster.client_address(n) for n in self.cluster.peers],
                           self.client, {"access_key": self.client.user.access_key,
                                         "secret": self.client.user.secret, "admin": False,
                                         "allow": [], "topics": {"bench": "PUB"}, "groups": {}})
        self.producer = Producer([self.cluster.namesrv_address], **self.client.as_user())
        self.single = Producer([self.cluster.namesrv_address], coalesce=False,
                               **self.client.as_user())
        if not self.client.secure:
            await self.producer.create_topic("bench", queues=8)
        await run_load(self.producer, 1.0, 1, 16)  # warm-up: connections, routes
        await run_load(self.single, 0.2, 1, 4)
        leader = await wait_leader(self.cluster)
        # Followers by rank (follower_1, follower_2), not node id: the modes'
        # clusters elect different leaders, and `cost` compares like with like.
        self.processes = {"client": os.getpid(), "leader": self.cluster.brokers[leader].proc.pid}
        followers = [child for nid, child in sorted(self.cluster.brokers.items()) if nid != leader]
        for rank, child in enumerate(followers, 1):
            self.processes[f"follower_{rank}"] = child.proc.pid
        if self.idle_seconds:
            servers = {k: v for k, v in self.processes.items() if k in SERVERS}
            before = {k: sum(cpu_split(pid)) for k, pid in servers.items()}
            await asyncio.sleep(self.idle_seconds)
            self.idle = {k: (sum(cpu_split(pid)) - before[k]) / self.idle_seconds
                         for k, pid in servers.items()}

    async def slice(self, load: Load, seconds: float, into: Slices) -> None:
        if load.processes:
            if self.workers is None:
                self.workers = ProducerProcesses(self.procs, self.cluster.namesrv_address,
                                                 "bench", self.worker_args)
                await self.workers.start()
            servers = {k: v for k, v in self.processes.items() if k != "client"}
            await run_processes(self.workers, seconds, servers, into)
            return
        producer = self.producer if load.coalesce else self.single
        assert producer is not None
        await run_load(producer, seconds, load.batch, load.in_flight, self.processes, into=into)

    async def stop_workers(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
            self.workers = None

    async def stop(self) -> None:
        await self.stop_workers()
        for producer in (self.producer, self.single):
            if producer is not None:
                await producer.close()
        await asyncio.to_thread(self.cluster.stop)


async def throughput(base: Path, flush: str, seconds: float, securities: list[str],
                     rounds: int, loads: list[str], procs: int, profiler: Profiler,
                     raft: dict[str, int] | None = None,
                     idle_seconds: float = 0.0) -> list[dict[str, Any]]:
    """Every load on every security mode's cluster, the modes taking turns."""
    benches = [Bench(base, flush, security, procs, raft, idle_seconds)
               for security in securities]
    try:
        for bench in benches:
            await bench.start()
        figures: dict[str, dict[str, Slices]] = {b.security: {} for b in benches}
        for load in loads:
            for r in range(rounds):
                turn = r % len(benches)
                for bench in benches[turn:] + benches[:turn]:
                    slices = figures[bench.security].setdefault(load, Slices())
                    slices.idle = bench.idle
                    profiler.start(f"{flush}-{bench.security}-{load}-r{r}",
                                   {k: bench.processes[k] for k in ("leader", "follower_1")})
                    try:
                        await bench.slice(LOADS[load], seconds / rounds, slices)
                    finally:
                        profiler.stop()
            if LOADS[load].processes:
                for bench in benches:  # N processes per cluster: not longer than needed
                    await bench.stop_workers()
        return [{"flush": flush, "replicate": "sync", "security": security,
                 **{load: s.summary() for load, s in figures[security].items()}}
                for security in securities]
    finally:
        for bench in benches:
            await bench.stop()


def costs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per flush and load, each secured mode against open (when both ran)."""
    out: dict[str, Any] = {}
    for run in runs:
        if run["security"] == "open":
            continue
        base = next((r for r in runs if r["flush"] == run["flush"]
                     and r["security"] == "open"), None)
        if base is None:
            continue
        for load in LOADS:
            if load not in run or load not in base:
                continue
            mine, theirs = run[load], base[load]
            cpu = {name: round(us - theirs["cpu_us_per_msg"].get(name, 0.0), 1)
                   for name, us in mine.get("cpu_us_per_msg", {}).items()
                   if name != "servers"}  # a sum: all_processes says it below
            cpu["all_processes"] = round(sum(cpu.values()), 1)
            out.setdefault(f"{run['flush']}/{load}", {})[run["security"]] = {
                "msgs_per_s_ratio": round(mine["msgs_per_s"] / theirs["msgs_per_s"], 3)
                if theirs["msgs_per_s"] else None,
                "p50_ms_added": round(mine["p50_ms"] - theirs["p50_ms"], 2),
                "p99_ms_added": round(mine["p99_ms"] - theirs["p99_ms"], 2),
                "cpu_us_per_msg_added": cpu}
    return out


async def ready_after(cluster: LocalCluster, killed: int, killed_at: float) -> float:
    """Seconds from the kill until a survivor reports itself leader with its
    first entry applied (polled every 10 ms): when the group could take the
    write, whatever the client does."""
    while True:
        for nid in cluster.peers:
            if nid == killed:
                continue
            st = await node_status(cluster.client_address(nid), timeout=0.5)
            if st and st.get("role") == "leader" and st.get("leader_ready"):
                return time.monotonic() - killed_at
        await asyncio.sleep(0.01)


async def caught_up(cluster: LocalCluster, timeout: float = 60.0) -> int:
    """Wait until every node follows one ready leader and has applied its
    commit index; the leader's id. A kill before a restarted node is back
    would leave one live node of three, and time its restart, not the
    election."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await wait_leader(cluster)
        statuses = {nid: await node_status(cluster.client_address(nid), timeout=0.5)
                    for nid in cluster.peers}
        lead = statuses.get(leader)
        if lead and all(st and st.get("applied_index", -1) >= lead["commit_index"]
                        and (nid == leader or st.get("leader_id") == leader)
                        for nid, st in statuses.items()):
            return leader
        await asyncio.sleep(0.05)
    raise TimeoutError("the group did not catch up after a restart")


async def failover(base: Path, kills: int) -> dict[str, object]:
    """SIGKILL the leader while a prober sends one message at a time with the
    SDK's own retry; kill -> first acknowledged send, and kill -> a ready new
    leader as the servers report it (the difference is the SDK's part)."""
    cluster = LocalCluster(base / "failover", settings={
        "flush": "async", "replicate": "sync", "segment_size_bytes": 64 << 20})
    cluster.start()
    times: list[float] = []
    ready: list[float] = []
    attempts: list[int] = []
    try:
        producer = Producer([cluster.namesrv_address], send_timeout=1.0, retry_timeout=30.0)
        await wait_leader(cluster)
        await producer.create_topic("fo", queues=4)
        for _ in range(kills):
            leader = await caught_up(cluster)
            for _ in range(20):  # the prober has a warm connection to the leader
                await producer.send("fo", b"warm")
            retries = producer.retries
            cluster.kill(leader)
            killed_at = time.monotonic()
            poller = asyncio.ensure_future(ready_after(cluster, leader, killed_at))
            await producer.send("fo", b"probe")
            times.append(time.monotonic() - killed_at)
            attempts.append(producer.retries - retries + 1)
            async with asyncio.timeout(30):
                ready.append(await poller)
            cluster.start_node(leader)
        await producer.close()
    finally:
        await asyncio.to_thread(cluster.stop)
    sdk = [t - r for t, r in zip(times, ready, strict=True)]
    return {"kills": kills, "p50_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3), "all_s": [round(t, 3) for t in times],
            "leader_ready_p50_s": round(statistics.median(ready), 3),
            "leader_ready_max_s": round(max(ready), 3),
            "leader_ready_all_s": [round(t, 3) for t in ready],
            # First ack minus the polled readiness (negative: the write was
            # taken before the 10 ms poll saw the new leader ready).
            "sdk_after_ready_p50_s": round(statistics.median(sdk), 3),
            "sdk_after_ready_max_s": round(max(sdk), 3),
            "attempts": attempts}


async def main(args: argparse.Namespace) -> None:
    # Each run writes gigabytes: the directory goes whatever happens.
    base = Path(tempfile.mkdtemp(prefix="ledgermq-bench-"))
    securities = [m for m in args.security.split(",") if m]
    loads = [m for m in args.loads.split(",") if m]
    profiler = Profiler(Path(args.profile) if args.profile else None)
    results: dict[str, Any] = {"bench": "produce", "nodes": 3, "message_bytes": len(BODY),
                               "securities": securities, "rounds": args.rounds,
                               "loads": loads, "procs": args.procs, "raft": args.raft,
                               "load_average_start": os.getloadavg(),
                               "calibration_s_start": calibrate(), "runs": []}
    raft = dict(RAFT[args.raft] or {})
    if args.reserve_batch is not None:
        raft["reserve_batch_entries"] = args.reserve_batch
        results["reserve_batch_entries"] = args.reserve_batch
    try:
        for flush in args.flush.split(",") if args.seconds > 0 else ():
            results["runs"] += await throughput(base, flush, args.seconds, securities,
                                                args.rounds, loads, args.procs, profiler,
                                                raft or None, args.idle_seconds)
        results["cost"] = costs(results["runs"])
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
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="per throughput run (0: failover only)")
    parser.add_argument("--kills", type=int, default=10, help="leader kills for failover (0: skip)")
    parser.add_argument("--security", default=",".join(SECURITY_MODES),
                        help="comma-separated security modes: open, auth, auth+tls")
    parser.add_argument("--rounds", type=int, default=3,
                        help="slices per figure, the security modes taking turns")
    parser.add_argument("--flush", default=",".join(FLUSHES), help="comma-separated: async, sync")
    parser.add_argument("--loads", default=",".join(LOADS),
                        help=f"comma-separated, of: {', '.join(LOADS)}")
    parser.add_argument("--procs", type=int, default=64,
                        help="independent producer processes of the `procs` load")
    parser.add_argument("--profile", default="",
                        help="directory for py-spy profiles of the leader and a follower")
    parser.add_argument("--raft", default="fast", choices=sorted(RAFT),
                        help="Raft timing: the launcher's (20 ms ticks) or the documented"
                             " defaults (50 ms ticks, as the side-by-side kit measures)")
    parser.add_argument("--reserve-batch", type=int, default=None,
                        help="[raft] reserve_batch_entries (default: the broker's; 0: every"
                             " follower gets each entry at once, docs/raft.md \"Reserves\")")
    parser.add_argument("--idle-seconds", type=float, default=0.0,
                        help="measure each server's idle CPU first; report CPU per message"
                             " less it (cpu_us_per_msg_less_idle)")
    parsed = parser.parse_args()
    unknown = (set(parsed.security.split(",")) - set(SECURITY_MODES)) | (
        set(parsed.flush.split(",")) - set(FLUSHES)) | (set(parsed.loads.split(",")) - set(LOADS))
    if unknown or parsed.rounds < 1 or parsed.procs < 1:
        parser.error(f"unknown {sorted(unknown)}; --security takes {', '.join(SECURITY_MODES)};"
                     " --rounds >= 1, --procs >= 1")
    loop.run(main(parsed))
