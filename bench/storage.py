"""Storage-engine benchmark: prints one JSON object per line.

Measured in one run, so ratios are meaningful on a shared 2-core machine:
- raw sequential write bandwidth of this disk for the same bytes and chunking;
- CommitLog append of 1 KiB messages, batches of 1 and 64, flush=async
  (bodies pre-encoded: the storage engine's own cost), and the same with
  message encoding included;
- flush=sync with 1, 8 and 64 concurrent appenders (group commit) against
  one-fsync-per-message, through `Flusher.append_new` (the Flusher places
  and writes a round at once) and, at 1 and 64 appenders, through
  `Flusher.append` (entries placed and written by each appender);
- reads by physical position (per message, as consumers do) and by range;
- recovery time per GiB (full verification) and the default tail open.

Usage: python bench/storage.py [--mib N] [--dir PATH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

from commitlog import (
    KIND_MESSAGES,
    CommitLog,
    CommitLogConfig,
    Flusher,
    Message,
    decode_messages,
    encode_message,
    encode_messages,
)

MESSAGE_SIZE = 1024


def loop_run(coroutine):  # type: ignore[no-untyped-def]
    """Run on uvloop when installed, as the servers do."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def one_kib_message(i: int) -> Message:
    """A message whose record is exactly 1 KiB."""
    probe = encode_message(Message("BenchTopic", b"", queue_id=i % 8, tags="t"), 1 << 20)
    body = bytes([i % 251]) * (MESSAGE_SIZE - len(probe))
    return Message("BenchTopic", body, queue_id=i % 8, tags="t")


def one_kib_record(i: int) -> bytes:
    return encode_message(one_kib_message(i), 1 << 20)


def raw_write(directory: str, total: int, chunk: int) -> float:
    """MB/s writing `total` bytes in `chunk`-sized writes, plus one fdatasync."""
    path = os.path.join(directory, "raw")
    data = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    written = 0
    while written < total:
        written += os.write(fd, data)
    os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    os.remove(path)
    return written / elapsed / 1e6


def append_async(directory: str, total: int, batch: int, encode: bool) -> tuple[float, float]:
    """(messages/s, MB/s) of flush=async appends including the final flush."""
    log = CommitLog.open(directory, CommitLogConfig(flush="async"))
    body = b"".join(one_kib_record(i) for i in range(batch))
    messages = [one_kib_message(i) for i in range(batch)]
    count = total // (MESSAGE_SIZE * batch)
    started = time.perf_counter()
    for _ in range(count):
        if encode:
            body = encode_messages(messages, 1 << 20)
        log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
    log.flush()
    elapsed = time.perf_counter() - started
    log.close()
    shutil.rmtree(directory)
    return count * batch / elapsed, count * len(body) / elapsed / 1e6


def append_sync(directory: str, appenders: int, seconds: float, batch: int = 1,
                api: str = "append_new") -> tuple[float, float, int, dict[str, float]]:
    """(messages/s, entries per fsync, fsyncs, round figures) with flush=sync,
    N appenders, each appending entries of `batch` messages and waiting for
    durability. Round figures: mean ms per fsync round of the fdatasync and of
    the hand-offs to the fsync thread and back.

    `api="append_new"`: the Flusher places the entries and writes a round's
    worth in one write (a single writer's path); `api="append"`: each appender
    places its entry and writes it at once (the path of pre-placed entries,
    e.g. a Raft follower's)."""

    async def run() -> tuple[float, float, int, dict[str, float]]:
        log = CommitLog.open(directory, CommitLogConfig(flush="sync"))
        flusher = Flusher(log)
        await flusher.start()
        record = b"".join(one_kib_record(i) for i in range(batch))
        deadline = time.perf_counter() + seconds
        done = 0

        async def appender() -> None:
            nonlocal done
            items = [(KIND_MESSAGES, record)]
            while time.perf_counter() < deadline:
                if api == "append_new":
                    await flusher.append_new(1, items)
                else:
                    await flusher.append(log.build_entries(1, items))
                done += batch

        started = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(appenders)))
        elapsed = time.perf_counter() - started
        await flusher.close()
        log.close()
        rounds = max(1, flusher.syncs)
        figures = {
            "fsync_ms": round(flusher.sync_s / rounds * 1000, 3),
            "handoff_ms": round((flusher.sync_start_wait_s + flusher.sync_resume_wait_s)
                                / rounds * 1000, 3),
            "round_ms": round(elapsed / rounds * 1000, 3),
            "early_rounds": flusher.early_rounds}
        return done / elapsed, flusher.synced_entries / rounds, flusher.syncs, figures

    result = loop_run(run())
    shutil.rmtree(directory)
    return result


def build_log(directory: str, total: int) -> int:
    log = CommitLog.open(directory, CommitLogConfig())
    body = b"".join(one_kib_record(i) for i in range(64))
    for _ in range(total // len(body)):
        log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
    log.close()
    return sum(os.path.getsize(os.path.join(directory, "commitlog", n))
               for n in os.listdir(os.path.join(directory, "commitlog")))


def reads(directory: str) -> tuple[float, float]:
    """(messages/s reading each message by physical offset, MB/s by range)."""
    log = CommitLog.open(directory, CommitLogConfig())
    units = []
    for entry in log.read_entries(1, min(log.last_index, 400) + 1):
        units += [(m.physical_offset, m.size) for m in decode_messages(entry.body,
                                                                       entry.position)]
    started = time.perf_counter()
    for offset, size in units:
        log.read_message(offset, size)
    per_message = len(units) / (time.perf_counter() - started)
    started = time.perf_counter()
    position, read = 0, 0
    while position < log.end:
        chunk = log.read_bytes(position, 1 << 20)
        if not chunk:  # the rollover gap at a segment's end
            position = (position // log.config.segment_size_bytes + 1) * (
                log.config.segment_size_bytes)
            continue
        read += len(chunk)
        position += len(chunk)
    by_range = read / (time.perf_counter() - started) / 1e6
    log.close()
    return per_message, by_range


def recovery(directory: str, size: int) -> tuple[float, float]:
    """(seconds per GiB for a full verification, seconds for the default open)."""
    os.remove(os.path.join(directory, "checkpoint"))
    started = time.perf_counter()
    log = CommitLog.open(directory, CommitLogConfig(verify_on_open="full"))
    full = time.perf_counter() - started
    log.close()
    started = time.perf_counter()
    CommitLog.open(directory, CommitLogConfig()).close()
    tail = time.perf_counter() - started
    return full / (size / 2**30), tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="bytes per write test, MiB")
    parser.add_argument("--sync-seconds", type=float, default=3.0)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.sync_seconds = 8, 0.3
    root = tempfile.mkdtemp(prefix="lmq-bench-", dir=args.dir)
    total = args.mib * 2**20
    try:
        emit(bench="raw_write", chunk_bytes=65536, mb_per_s=round(raw_write(root, total, 65536), 1))
        emit(bench="raw_write", chunk_bytes=1024, mb_per_s=round(raw_write(root, total // 8,
                                                                           1024), 1))
        raw = raw_write(root, total, 65536)
        for batch in (1, 64):
            for encode in (False, True):
                part = total if batch == 64 else total // 8
                rate, mbs = append_async(os.path.join(root, "a"), part, batch, encode)
                emit(bench="append", flush="async", batch=batch, encode=encode,
                     messages_per_s=round(rate), mb_per_s=round(mbs, 1),
                     raw_write_mb_per_s=round(raw, 1), ratio_to_raw=round(mbs / raw, 3))
        # Group commit against one fsync per message (batch 1, one appender),
        # through each API; the baseline is measured per API.
        runs = [("append_new", batch, appenders) for batch in (1, 64)
                for appenders in (1, 8, 64)] + [("append", 1, 1), ("append", 1, 64)]
        baselines: dict[str, float] = {}
        for api, batch, appenders in runs:
            # Write back what earlier runs left dirty (512 MiB of async appends)
            # first: the kernel flushing it meanwhile slows these fsyncs.
            os.sync()
            rate, per_sync, syncs, rounds = append_sync(
                os.path.join(root, "s"), appenders, args.sync_seconds, batch, api)
            baseline = baselines.setdefault(api, rate)
            emit(bench="append", flush="sync", api=api, batch=batch, appenders=appenders,
                 messages_per_s=round(rate), entries_per_fsync=round(per_sync, 1),
                 fsyncs=syncs,
                 speedup_vs_one_fsync_per_message=round(rate / baseline, 1), **rounds)
        log_dir = os.path.join(root, "r")
        size = build_log(log_dir, total)
        per_message, by_range = reads(log_dir)
        emit(bench="read", by="physical_offset", messages_per_s=round(per_message))
        emit(bench="read", by="range", mb_per_s=round(by_range, 1))
        per_gib, tail = recovery(log_dir, size)
        emit(bench="recovery", log_bytes=size, full_verify_s_per_gib=round(per_gib, 2),
             default_open_s=round(tail, 3))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
