"""Benchmark of the Spark audit: 3 replicas, >= 5 million 1 KiB messages in total.

Writes one replica by the format page (64 messages per entry, 256 MiB
segments, 8 queues), copies it twice (replicas are byte-identical), audits the
group on ``local[2]`` and prints one JSON line: entries and messages audited
per second (overall and per core), wall times, where the time goes, and the
CPU actually used (Python tasks, JVM, driver, whole machine: the box may be
shared, and wall time under contention overstates the work). JVM
start and the first Python-worker job of the session (``session.warm_up``)
are timed separately and excluded from the rates; ``total_wall_s`` includes
them. The data lives in a temporary directory that is deleted at the end.

    .venv/bin/python bench/audit.py [--messages 5000000] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

from spark_audit import fmt, parse, tasks

TOPIC = b"bench"
HOST = b"10.0.0.1:5000"
QUEUES = 8


def write_replica(root: str, n_msgs: int, per_entry: int, msg_size: int, seg_size: int) -> dict:
    """Stream one replica's files to ``root``; returns counts."""
    for d in ("commitlog", "index", "consumequeue"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    body_len = msg_size - 68 - len(TOPIC) - len(HOST) - 4
    payload = bytes(range(256)) * (body_len // 256 + 2)
    tags = [b"", b"red"]
    tag_hash = [fmt.tag_hash(t) for t in tags]
    pack = fmt.MESSAGE_HEADER.pack
    units = {q: bytearray() for q in range(QUEUES)}
    index = bytearray()
    seg_file = None
    seg_start = -1
    end = 0
    entries = 0
    seq = 0
    term = 1
    while seq < n_msgs:
        n = min(per_entry, n_msgs - seq)
        recs = []
        offs = []
        at = 0
        for k in range(n):
            s = seq + k
            tag = tags[s & 1]
            size = 68 + len(TOPIC) + len(tag) + len(HOST) + body_len
            recs.append(pack(size, s % QUEUES, 0, 0, 1_700_000_000_000 + s, 1_700_000_000_000 + s,
                             0x5EED, s, 0, len(TOPIC), len(tag), 0, len(HOST), 0, body_len))
            recs.append(TOPIC + tag + HOST + payload[s % 256:s % 256 + body_len])
            offs.append((s % QUEUES, at, size, tag_hash[s & 1]))
            at += size
        body = b"".join(recs)
        size = 48 + len(body)
        pos = end if end % seg_size + size <= seg_size else (end // seg_size + 1) * seg_size
        if pos - pos % seg_size != seg_start:
            if seg_file:
                seg_file.close()
            seg_start = pos - pos % seg_size
            seg_file = open(os.path.join(root, "commitlog", f"{seg_start:020d}"), "wb")  # noqa: SIM115
        entries += 1
        bcrc = fmt.crc(body)
        head = fmt.ENTRY_HEADER.pack(fmt.ENTRY_MAGIC, 1, 1, 0, size, bcrc, entries, term, pos, 0)
        seg_file.write(head + struct.pack("<I", fmt.crc(head)) + body)
        rec = fmt.INDEX_RECORD.pack(pos, term, size, 1, bcrc)
        index += rec + struct.pack("<I", fmt.crc(rec))
        for q, at, msize, th in offs:
            units[q] += fmt.CQ_UNIT.pack(pos + 48 + at, msize, th)
        end = pos + size
        seq += n
    seg_file.close()
    per_file = fmt.DEFAULT_INDEX_FILE_RECORDS * 32
    for i in range(0, len(index), per_file):
        with open(os.path.join(root, "index", f"{1 + i // 32:020d}"), "wb") as f:
            f.write(index[i:i + per_file])
    cq_file = fmt.DEFAULT_CQ_UNITS_PER_FILE * 20
    for q, buf in units.items():
        d = os.path.join(root, "consumequeue", TOPIC.decode(), str(q))
        os.makedirs(d, exist_ok=True)
        for i in range(0, len(buf), cq_file):
            with open(os.path.join(d, f"{i // 20:020d}"), "wb") as f:
                f.write(buf[i:i + cq_file])
    with open(os.path.join(root, "checkpoint"), "wb") as f:
        f.write(fmt.encode_checkpoint(fmt.Checkpoint(entries, end, term, 1)))
    with open(os.path.join(root, "hardstate"), "wb") as f:
        f.write(fmt.encode_hardstate(fmt.HardState(term, 1, entries)))
    with open(os.path.join(root, "consumequeue", "checkpoint"), "wb") as f:
        f.write(fmt.encode_dispatch_checkpoint(fmt.DispatchCheckpoint(
            entries, end, tuple((TOPIC.decode(), q, len(b) // 20) for q, b in units.items()))))
    return {"entries": entries, "messages": n_msgs, "bytes": end}


def parse_rate(root: str) -> dict:
    """In-process parse of the first segment: the per-core cost of the pure parsers."""
    path = os.path.join(root, "commitlog", f"{0:020d}")
    buf = tasks.read_local(path)
    warm = memoryview(buf)[:1 << 20]
    parse.parse_messages(warm, 0, parse.scan_segment(warm, 0).entries)  # warm imports
    t = time.perf_counter()
    scan = parse.scan_segment(buf, 0)
    t_scan = time.perf_counter() - t
    t = time.perf_counter()
    m = parse.parse_messages(buf, 0, scan.entries)
    t_msgs = time.perf_counter() - t
    return {"segment_bytes": len(buf), "entries": len(scan.entries),
            "messages": len(m.messages), "scan_s": round(t_scan, 3),
            "decode_s": round(t_msgs, 3),
            "scan_mb_per_s": round(len(buf) / t_scan / 1e6),
            "decode_messages_per_s": round(len(m.messages) / t_msgs)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=5_000_000, help="total over 3 replicas")
    ap.add_argument("--per-entry", type=int, default=64)
    ap.add_argument("--msg-size", type=int, default=1024)
    ap.add_argument("--segment-size", type=int, default=fmt.DEFAULT_SEGMENT_SIZE)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="parent of the temporary data directory")
    a = ap.parse_args()
    cores = int(a.master[6:-1]) if a.master.startswith("local[") and a.master[6:-1].isdigit() \
        else os.cpu_count()
    tmp = tempfile.mkdtemp(prefix="ledgermq-audit-bench-", dir=a.dir)
    try:
        t = time.perf_counter()
        per_replica = -(-a.messages // 3)
        write_replica(os.path.join(tmp, "g1", "n1"), per_replica, a.per_entry,
                      a.msg_size, a.segment_size)
        for n in ("n2", "n3"):
            # Real copies (not hard links): each replica has its own page-cache pages.
            shutil.copytree(os.path.join(tmp, "g1", "n1"), os.path.join(tmp, "g1", n))
        gen_s = time.perf_counter() - t
        pure = parse_rate(os.path.join(tmp, "g1", "n1"))

        from spark_audit import cli, session

        t0 = time.perf_counter()
        spark = session.get_session(a.master, progress=False)
        session_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        session.warm_up(spark)
        warm_s = time.perf_counter() - t0
        out = os.path.join(tmp, "out")
        jvm = spark.sparkContext._gateway.proc.pid
        before = (cpu_seconds(jvm), os.times(), machine_cpu(), cpu_pressure())
        t1 = time.perf_counter()
        rc = cli.run([os.path.join(tmp, "g1")], out=out, master=a.master, spark=spark,
                     progress=False)
        audit_s = time.perf_counter() - t1
        after = (cpu_seconds(jvm), os.times(), machine_cpu(), cpu_pressure())
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        spark.stop()
        entries = summary["inputs"]["entries"]
        messages = summary["inputs"]["messages"]
        tm = summary["timings_s"]
        phases = ("discover_s", "read_small_s", "scan_job_s", "log_checks_s", "decode_job_s",
                  "queue_checks_s", "duplicate_checks_s")
        result = {
            "bench": "spark_audit", "master": a.master, "cores": cores, "valid": summary["valid"],
            "exit_code": rc, "replicas": 3, "messages": messages, "entries": entries,
            "messages_decoded": summary["inputs"]["messages_decoded"],
            "bytes": summary["inputs"]["bytes"], "segments": summary["inputs"]["segments"],
            "cq_units": summary["inputs"]["cq"],
            "cq_units_decoded": summary["inputs"]["cq_units_decoded"],
            "index_records": summary["inputs"]["index"],
            "session_start_s": round(session_s, 2), "worker_warmup_s": round(warm_s, 2),
            "audit_wall_s": round(audit_s, 2),
            "total_wall_s": round(session_s + warm_s + audit_s, 2),
            "messages_per_s_incl_warmup": round(messages / (audit_s + warm_s)),
            "entries_per_s": round(entries / audit_s),
            "entries_per_s_per_core": round(entries / audit_s / cores),
            "messages_per_s": round(messages / audit_s),
            "messages_per_s_per_core": round(messages / audit_s / cores),
            "mb_per_s": round(summary["inputs"]["bytes"] / audit_s / 1e6),
            "breakdown_s": {
                "discover_and_small_files": round(tm["discover_s"] + tm["read_small_s"], 2),
                "spark_scan_job": tm["scan_job_s"],
                "assemble_and_log_checks_driver": tm["log_checks_s"],
                "decode_job_and_problems": tm["decode_job_s"],
                "queue_checks_driver": tm["queue_checks_s"],
                "duplicate_checks_driver": tm["duplicate_checks_s"],
                "reports": round(audit_s - sum(tm[k] for k in phases), 2),
            },
            "task_cpu_s": {k[6:-6]: v for k, v in tm.items()
                           if k.startswith("tasks_") and k.endswith("_cpu_s")},
            "task_wall_s": {k[6:-7]: v for k, v in tm.items()
                            if k.startswith("tasks_") and k.endswith("_wall_s")},
            "cpu_during_audit_s": {
                "python_tasks": round(sum(v for k, v in tm.items()
                                          if k.startswith("tasks_") and k.endswith("_cpu_s")), 2),
                "jvm": round(after[0] - before[0], 2),
                "driver_python": round(sum(after[1][:2]) - sum(before[1][:2]), 2),
                "whole_machine_busy": round(after[2][0] - before[2][0], 2),
                "whole_machine_available": round(after[2][1] - before[2][1], 2),
                "cpu_pressure_some_avg10": [before[3], after[3]],
            },
            "pure_parse_one_segment": pure, "generate_s": round(gen_s, 1),
        }
        print(json.dumps(result))
        return 0 if rc == 0 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
