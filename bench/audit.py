"""Benchmark of the Spark audit: 3 byte-identical replicas, at one or more sizes.

Writes one replica by the format page (``--per-entry`` messages of
``--msg-size`` bytes per entry, 256 MiB segments, 8 queues; vectorized, so
tens of millions of entries take seconds), copies it twice, audits the
group on ``--master`` (``local[2]`` by default) and prints one JSON line:
entries and messages audited per second (overall and per core), wall
times, where the time goes, the CPU actually used (the box may be shared)
and the peak resident memory of the driver (this Python process, sampled
during the audit) and of its JVM (in ``local[N]`` that JVM runs the
executors too; with ``--standalone N`` the executors are the workers'
JVMs). JVM start and the first Python-worker job of the session
(``session.warm_up``) are timed apart and excluded from the rates.

With ``--sizes A,B`` each size (entries per replica) runs in its own child
process, one after the other, and a last line compares them (the driver's
peak memory must not grow with the data). Data lives in a temporary
directory that is deleted at the end.

    .venv/bin/python bench/audit.py --per-entry 1 --msg-size 256 --sizes 1000000,8000000
    .venv/bin/python bench/audit.py [--entries N | --messages N] [--master spark://...]
    .venv/bin/python bench/audit.py --per-entry 1 --msg-size 256 --entries 2000000 --nightly 7
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from spark_audit import fmt, parse, tasks

TOPIC = b"bench"
HOST = b"10.0.0.1:5000"
TAGS = (b"", b"red")
QUEUES = 8
PRODUCER = 0x5EED


def _records(first: int, n: int, size: int) -> np.ndarray:
    """Messages ``first..first+n-1`` as an (n, size) byte array (records of one size:
    the body is shortened by the tag, which alternates between none and "red")."""
    seq = np.arange(first, first + n, dtype=np.int64)
    head = np.zeros(n, parse.MESSAGE_DTYPE)
    tag_len = np.where(seq & 1, len(TAGS[1]), 0)
    head["size"] = size
    head["queue_id"] = seq % QUEUES
    head["born_ts"] = 1_700_000_000_000 + seq
    head["store_ts"] = 1_700_000_000_000 + seq
    head["producer_id"] = PRODUCER
    head["sequence"] = seq
    head["topic_len"] = len(TOPIC)
    head["tags_len"] = tag_len
    head["host_len"] = len(HOST)
    head["body_len"] = size - fmt.MESSAGE_HEADER_SIZE - len(TOPIC) - len(HOST) - tag_len
    out = np.empty((n, size), np.uint8)
    out[:, :fmt.MESSAGE_HEADER_SIZE] = head.view(np.uint8).reshape(n, fmt.MESSAGE_HEADER_SIZE)
    payload = bytes(range(256)) * (size // 256 + 2)
    for parity, tag in enumerate(TAGS):
        tail = TOPIC + tag + HOST
        tail += payload[:size - fmt.MESSAGE_HEADER_SIZE - len(tail)]
        out[(parity - first) % 2::2, fmt.MESSAGE_HEADER_SIZE:] = np.frombuffer(tail, np.uint8)
    return out


class _Appender:
    """Fixed-size files of fixed-size records, written as they fill (index, queues)."""

    def __init__(self, directory: str, per_file: int, record: int, first: int) -> None:
        self.dir, self.per_file, self.record, self.first = directory, per_file, record, first
        self.parts: list[np.ndarray] = []
        self.n = 0  # records written or buffered
        os.makedirs(directory, exist_ok=True)

    def add(self, rows: np.ndarray) -> None:
        """Records as bytes (a uint8 array of whole records)."""
        self.parts.append(rows.reshape(-1))
        self.n += rows.size // self.record
        self.flush(False)

    def flush(self, final: bool = True) -> None:
        data = np.concatenate(self.parts) if self.parts else np.zeros(0, np.uint8)
        self.parts = []
        done = self.n - len(data) // self.record  # records already in files
        while len(data) and (final or (done % self.per_file) + len(data) // self.record
                             >= self.per_file):
            room = self.per_file - done % self.per_file
            take = min(room, len(data) // self.record)
            name = os.path.join(self.dir, f"{self.first + done - done % self.per_file:020d}")
            with open(name, "ab") as f:
                f.write(data[:take * self.record].tobytes())
            data, done = data[take * self.record:], done + take
        if len(data):
            self.parts = [data]


def write_replica(root: str, n_entries: int, per_entry: int, msg_size: int,
                  seg_size: int = fmt.DEFAULT_SEGMENT_SIZE) -> dict[str, int]:
    """One replica of ``n_entries`` entries of ``per_entry`` messages, in ``root``."""
    entry = fmt.ENTRY_HEADER_SIZE + per_entry * msg_size
    per_seg = seg_size // entry
    os.makedirs(os.path.join(root, "commitlog"), exist_ok=True)
    index = _Appender(os.path.join(root, "index"), fmt.DEFAULT_INDEX_FILE_RECORDS,
                      fmt.INDEX_RECORD_SIZE, 1)
    queues = [_Appender(os.path.join(root, "consumequeue", TOPIC.decode(), str(q)),
                        fmt.DEFAULT_CQ_UNITS_PER_FILE, fmt.CQ_UNIT_SIZE, 0)
              for q in range(QUEUES)]
    tag_hash = np.array([fmt.tag_hash(t) for t in TAGS], np.uint64)
    done, seg, end = 0, 0, 0
    while done < n_entries:
        k = min(per_seg, n_entries - done)
        start = seg * seg_size
        body = _records(done * per_entry, k * per_entry, msg_size).reshape(k, -1)
        crc = fmt.crc
        bcrc = np.fromiter((crc(row) for row in body), np.uint32, k)
        pos = start + np.arange(k, dtype=np.int64) * entry
        head = np.zeros(k, parse.HEADER_DTYPE)
        head["magic"], head["version"], head["kind"] = fmt.ENTRY_MAGIC, 1, fmt.KIND_MESSAGES
        head["size"], head["body_crc"] = entry, bcrc
        head["index"] = np.arange(done + 1, done + k + 1)
        head["term"], head["position"] = 1, pos
        raw = head.view(np.uint8).reshape(k, fmt.ENTRY_HEADER_SIZE)
        head["header_crc"] = np.fromiter((crc(row[:44]) for row in raw), np.uint32, k)
        with open(os.path.join(root, "commitlog", f"{start:020d}"), "wb") as f:
            f.write(np.concatenate([raw, body], axis=1).tobytes())
        rec = np.zeros(k, parse.INDEX_DTYPE)
        rec["position"], rec["term"], rec["size"], rec["kind"] = pos, 1, entry, 1
        rec["body_crc"] = bcrc
        rr = rec.view(np.uint8).reshape(k, fmt.INDEX_RECORD_SIZE)
        rec["record_crc"] = np.fromiter((crc(row[:28]) for row in rr), np.uint32, k)
        index.add(rec.view(np.uint8))
        seq = np.arange(done * per_entry, (done + k) * per_entry, dtype=np.int64)
        units = np.zeros(len(seq), parse.CQ_DTYPE)
        units["offset"] = (np.repeat(pos, per_entry) + fmt.ENTRY_HEADER_SIZE
                           + np.tile(np.arange(per_entry) * msg_size, k))
        units["size"], units["tag_hash"] = msg_size, tag_hash[seq & 1]
        for q in range(QUEUES):
            queues[q].add(units[seq % QUEUES == q].view(np.uint8))
        done += k
        end = int(pos[-1]) + entry
        seg += 1
    index.flush()
    for a in queues:
        a.flush()
    with open(os.path.join(root, "checkpoint"), "wb") as f:
        f.write(fmt.encode_checkpoint(fmt.Checkpoint(n_entries, end, 1, 1)))
    with open(os.path.join(root, "hardstate"), "wb") as f:
        f.write(fmt.encode_hardstate(fmt.HardState(1, 1, n_entries)))
    with open(os.path.join(root, "consumequeue", "checkpoint"), "wb") as f:
        f.write(fmt.encode_dispatch_checkpoint(fmt.DispatchCheckpoint(
            n_entries, end, tuple((TOPIC.decode(), q, a.n) for q, a in enumerate(queues)))))
    return {"entries": n_entries, "messages": n_entries * per_entry, "bytes": end}


def write_identity(root: str, node_id: int) -> None:
    """The replica's ``IDENTITY``: node ``node_id`` with a directory id of its own.
    Written after a replica is copied from another, as every node's directory
    carries its own (the audit flags two replicas sharing one)."""
    ident = fmt.Identity(node_id, secrets.randbelow((1 << 63) - 1) + 1,
                         int(time.time() * 1000), "bench")
    with open(os.path.join(root, "IDENTITY"), "wb") as f:
        f.write(fmt.encode_identity(ident))


def parse_rate(root: str) -> dict[str, float]:
    """In-process parse of the first segment: the per-core cost of the pure parsers."""
    path = os.path.join(root, "commitlog", f"{0:020d}")
    buf = tasks.read_local(path)
    warm = memoryview(buf)[:1 << 20]
    parse.scan_segment(warm, 0)
    t = time.perf_counter()
    scan = parse.scan_segment(buf, 0)
    t_scan = time.perf_counter() - t
    t = time.perf_counter()
    m = parse.parse_messages(buf, 0, scan.entries)
    t_msgs = time.perf_counter() - t
    return {"segment_bytes": len(buf), "entries": len(scan.entries),
            "messages": len(m.messages), "scan_s": round(t_scan, 3),
            "decode_s": round(t_msgs, 3),
            "scan_entries_per_s": round(len(scan.entries) / t_scan),
            "decode_messages_per_s": round(len(m.messages) / t_msgs)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (Linux /proc), 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakRss:
    """Samples the resident memory of processes every 50 ms; keeps each one's peak."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mb(pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    tck = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / tck, sum(v) / tck


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which some task waited for a CPU (Linux PSI)."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def run_one(a: argparse.Namespace, entries: int) -> dict[str, object]:
    cores = int(a.master[6:-1]) if a.master.startswith("local[") and a.master[6:-1].isdigit() \
        else os.cpu_count() or 1
    tmp = tempfile.mkdtemp(prefix="ledgermq-audit-bench-", dir=a.dir)
    stack = contextlib.ExitStack()
    try:
        if a.standalone:
            from spark_audit import cluster

            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            os.makedirs(os.path.join(tmp, "cluster"))
            c = stack.enter_context(cluster.cluster(Path(tmp) / "cluster", workers=a.standalone,
                                                    cores=1, memory="2g"))
            a.master, cores = c.url, a.standalone
        t = time.perf_counter()
        write_replica(os.path.join(tmp, "g1", "n1"), entries, a.per_entry, a.msg_size,
                      a.segment_size)
        for n in ("n2", "n3"):
            # Real copies (not hard links): each replica has its own page-cache pages.
            shutil.copytree(os.path.join(tmp, "g1", "n1"), os.path.join(tmp, "g1", n))
        for k, n in enumerate(("n1", "n2", "n3"), start=1):
            write_identity(os.path.join(tmp, "g1", n), k)
        gen_s = time.perf_counter() - t
        pure = parse_rate(os.path.join(tmp, "g1", "n1"))

        from spark_audit import cli, session

        t0 = time.perf_counter()
        spark = session.get_session(a.master, progress=False, extra_conf={
            "spark.driver.host": "127.0.0.1",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0"} if a.standalone else None)
        session_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        session.warm_up(spark)
        warm_s = time.perf_counter() - t0
        out = os.path.join(tmp, "out")
        jvm = spark.sparkContext._gateway.proc.pid
        before = (cpu_seconds(jvm), os.times(), machine_cpu(), cpu_pressure())
        rss0 = rss_mb(os.getpid())
        t1 = time.perf_counter()
        with PeakRss({"driver": os.getpid(), "jvm": jvm}) as peak:
            rc = cli.run([os.path.join(tmp, "g1")], out=out, master=a.master, spark=spark,
                         progress=False)
        audit_s = time.perf_counter() - t1
        after = (cpu_seconds(jvm), os.times(), machine_cpu(), cpu_pressure())
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        nights = run_nights(a, tmp, entries, spark) if a.nightly else None
        spark.stop()
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    ins = summary["inputs"]
    n_entries, messages = ins["entries"], ins["messages"]
    tm = summary["timings_s"]
    phases = ("discover_s", "read_small_s", "pass1_job_s", "log_checks_s", "pass2_job_s",
              "queue_checks_s", "duplicate_checks_s")
    task_cpu = {k[6:-6]: v for k, v in tm.items() if k.startswith("tasks_") and
                k.endswith("_cpu_s")}
    return {
        "bench": "spark_audit", "master": a.master, "cores": cores, "valid": summary["valid"],
        "exit_code": rc, "replicas": 3, "entries_per_replica": entries,
        "per_entry": a.per_entry, "msg_size": a.msg_size, "entries": n_entries,
        "messages": messages, "messages_decoded": ins.get("messages_decoded"),
        "bytes": ins["bytes"], "segments": ins["segments"], "cq_units": ins["cq"],
        "index_records": ins["index"], "runs": ins.get("runs"),
        "session_start_s": round(session_s, 2), "worker_warmup_s": round(warm_s, 2),
        "audit_wall_s": round(audit_s, 2),
        "total_wall_s": round(session_s + warm_s + audit_s, 2),
        "entries_per_s": round(n_entries / audit_s),
        "entries_per_s_per_core": round(n_entries / audit_s / cores),
        "messages_per_s": round(messages / audit_s),
        "messages_per_s_per_core": round(messages / audit_s / cores),
        "mb_per_s": round(ins["bytes"] / audit_s / 1e6),
        "driver_rss_before_mb": round(rss0),
        "driver_peak_rss_mb": round(peak.peak["driver"]),
        "jvm_peak_rss_mb": round(peak.peak["jvm"]),
        "breakdown_s": {
            "discover_and_small_files": round(tm["discover_s"] + tm["read_small_s"], 2),
            "pass1_spark_job": tm["pass1_job_s"],
            "log_checks_driver": tm["log_checks_s"],
            "pass2_spark_job": tm["pass2_job_s"],
            "queue_checks_driver": tm["queue_checks_s"],
            "duplicate_checks_driver": tm["duplicate_checks_s"],
            "reports": round(audit_s - sum(tm[k] for k in phases), 2),
        },
        "task_cpu_s": task_cpu,
        "cpu_during_audit_s": {
            "python_tasks_map": round(sum(task_cpu.values()), 2),
            "jvm": round(after[0] - before[0], 2),
            "driver_python": round(sum(after[1][:2]) - sum(before[1][:2]), 2),
            "python_workers_and_rest": round(after[1][2] + after[1][3] - before[1][2]
                                             - before[1][3], 2),
            "whole_machine_busy": round(after[2][0] - before[2][0], 2),
            "whole_machine_available": round(after[2][1] - before[2][1], 2),
            "cpu_pressure_some_avg10": [before[3], after[3]],
        },
        "pure_parse_one_segment": pure, "generate_s": round(gen_s, 1),
        **({"nights": nights} if nights is not None else {}),
    }


def run_nights(a: argparse.Namespace, tmp: str, entries: int, spark: object
               ) -> list[dict[str, object]]:
    """``--nightly N``: nights of the incremental audit over the same replicas, the log
    growing by cuts (80 %, 90 %, then all of it, then nothing new), with
    ``--rolling-nights N``; per night its wall time and what it read."""
    from spark_audit import nightly

    state = os.path.join(tmp, "state")
    out = []
    for frac in (0.8, 0.9, 1.0, 1.0):
        cut = int(entries * frac)
        t = time.perf_counter()
        code = nightly.run_night(nightly.NightOptions(
            [os.path.join(tmp, "g1")], state, a.nightly, {"g1": cut}, "spark", a.master,
            progress=False))
        wall = time.perf_counter() - t
        with open(os.path.join(state, "latest.json")) as f:
            g = json.load(f)["groups"]["g1"]
        out.append({"exit": code, "cut": cut, "wall_s": round(wall, 2), "new": g["new"],
                    "reverified": g["reverified"], "entries_audited": g["entries_audited"],
                    "bytes_audited": g["bytes_audited"], "runs": len(g["runs"])})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=0, help="entries per replica")
    ap.add_argument("--messages", type=int, default=5_000_000,
                    help="total over 3 replicas (when --entries is not given)")
    ap.add_argument("--sizes", default="", help="entries per replica, comma-separated: "
                                                "one child process per size, then a comparison")
    ap.add_argument("--per-entry", type=int, default=64)
    ap.add_argument("--msg-size", type=int, default=1024)
    ap.add_argument("--segment-size", type=int, default=fmt.DEFAULT_SEGMENT_SIZE)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="parent of the temporary data directory")
    ap.add_argument("--nightly", type=int, default=0, metavar="N",
                    help="after the full audit, four nights of the incremental audit "
                         "(--rolling-nights N) over the same replicas, the log growing")
    ap.add_argument("--standalone", type=int, default=0, metavar="WORKERS",
                    help="start a standalone cluster of that many 1-core workers on this "
                         "machine (spark_audit.cluster) and audit on it")
    a = ap.parse_args()
    if a.sizes:
        results = []
        for size in (int(x) for x in a.sizes.split(",")):
            args = [sys.executable, __file__, "--entries", str(size), "--per-entry",
                    str(a.per_entry), "--msg-size", str(a.msg_size), "--segment-size",
                    str(a.segment_size), "--master", a.master, "--standalone",
                    str(a.standalone)]
            if a.dir:
                args += ["--dir", a.dir]
            proc = subprocess.run(args, capture_output=True, text=True)
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                print(proc.stderr[-4000:], file=sys.stderr)
                return 2
            line = proc.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            results.append(json.loads(line))
        lo, hi = results[0], results[-1]
        print(json.dumps({
            "bench": "spark_audit_sizes", "entries": [r["entries"] for r in results],
            "entries_per_s_per_core": [r["entries_per_s_per_core"] for r in results],
            "audit_wall_s": [r["audit_wall_s"] for r in results],
            "driver_peak_rss_mb": [r["driver_peak_rss_mb"] for r in results],
            "driver_peak_rss_growth": round(hi["driver_peak_rss_mb"]
                                            / max(lo["driver_peak_rss_mb"], 1) - 1, 3),
            "jvm_peak_rss_mb": [r["jvm_peak_rss_mb"] for r in results],
        }))
        return 0 if all(r["valid"] for r in results) else 1
    entries = a.entries or -(-a.messages // 3 // a.per_entry)
    result = run_one(a, entries)
    print(json.dumps(result))
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
