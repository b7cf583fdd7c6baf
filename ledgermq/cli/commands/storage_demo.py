"""`ledgermq storage-demo`: the storage engine at work, with timings.

Appends messages to a CommitLog (async flush, then sync flush with concurrent
appenders), dispatches them to ConsumeQueues, reads them back by queue offset,
simulates a crash with a torn tail and shows recovery cutting it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import typer


def register(app: typer.Typer) -> None:
    app.command("storage-demo")(storage_demo)


def storage_demo(
    messages: int = typer.Option(100_000, help="Messages to append (1 KiB each)."),
    batch: int = typer.Option(64, help="Messages per entry."),
    data_dir: str = typer.Option("", help="Where to write (default: a temporary directory)."),
) -> None:
    """Append, read back, crash and recover a CommitLog, printing timings."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from commitlog import (
        KIND_MESSAGES,
        CommitLog,
        CommitLogConfig,
        Flusher,
        Message,
        encode_messages,
    )
    from consumequeue import ConsumeQueueStore

    console = Console()
    root = data_dir or tempfile.mkdtemp(prefix="ledgermq-storage-demo-")
    table = Table(title=f"LedgerMQ storage engine — {root}")
    for column in ("step", "messages", "seconds", "messages/s", "note"):
        table.add_column(column)
    config = CommitLogConfig(segment_size_bytes=64 * 1024 * 1024)
    body = encode_messages(
        [Message("DemoTopic", b"x" * 950, queue_id=i % 4, tags=f"tag{i % 2}")
         for i in range(batch)],
        config.message_size_bytes_max,
    )
    try:
        log = CommitLog.open(os.path.join(root, "node"), config)
        started = time.perf_counter()
        for _ in range(messages // batch):
            log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
        log.flush()
        elapsed = time.perf_counter() - started
        count = messages // batch * batch
        table.add_row("append, flush=async", str(count), f"{elapsed:.3f}",
                      f"{count / elapsed:,.0f}", f"{log.end / 2**20:.0f} MiB, one fsync at the end")

        async def sync_appends() -> tuple[int, float, int]:
            flusher = Flusher(log, sync=True)
            await flusher.start()
            done = 0
            one = encode_messages([Message("DemoTopic", b"y" * 950)], config.message_size_bytes_max)

            async def appender() -> None:
                nonlocal done
                for _ in range(200):
                    await flusher.append(log.build_entries(1, [(KIND_MESSAGES, one)]))
                    done += 1

            began = time.perf_counter()
            await asyncio.gather(*(appender() for _ in range(32)))
            seconds = time.perf_counter() - began
            await flusher.close()
            return done, seconds, flusher.syncs

        done, seconds, syncs = asyncio.run(sync_appends())
        table.add_row("append, flush=sync, 32 appenders", str(done), f"{seconds:.3f}",
                      f"{done / seconds:,.0f}", f"{syncs} fsyncs (group commit)")

        store = ConsumeQueueStore.open(os.path.join(root, "node"), log)
        started = time.perf_counter()
        store.dispatch_committed(log.last_index)
        elapsed = time.perf_counter() - started
        table.add_row("dispatch to ConsumeQueues", str(count + done), f"{elapsed:.3f}",
                      f"{(count + done) / elapsed:,.0f}", f"{len(store.queues)} queues")
        started = time.perf_counter()
        read = 0
        for queue_id in range(4):
            offset = 0
            while True:
                units = store.read("DemoTopic", queue_id, offset, 256)
                if not units:
                    break
                for unit in units:
                    log.read_message(unit.physical_offset, unit.size)
                read += len(units)
                offset = units[-1].queue_offset + 1
        elapsed = time.perf_counter() - started
        table.add_row("read back by queue offset", str(read), f"{elapsed:.3f}",
                      f"{read / elapsed:,.0f}", "every message decoded")
        store.close()
        for _ in range(3):  # written, never synced: what a crash may tear
            log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
        last_index, end = log.last_index, log.end
        log.abandon()  # a crash: no final sync, no checkpoint
        base = end // config.segment_size_bytes * config.segment_size_bytes
        segment = os.path.join(root, "node", "commitlog", f"{base:020d}")
        os.truncate(segment, os.path.getsize(segment) - 100)  # a torn last entry
        started = time.perf_counter()
        log = CommitLog.open(os.path.join(root, "node"), config)
        elapsed = time.perf_counter() - started
        cut = log.recovery.cuts[0] if log.recovery.cuts else None
        table.add_row("recover after a torn tail", "-", f"{elapsed:.3f}", "-",
                      f"last index {last_index} -> {log.last_index}; "
                      + (f"cut at {os.path.basename(cut.path)}:{cut.offset} ({cut.reason})"
                         if cut else "nothing cut"))
        log.close()
        console.print(table)
    finally:
        if not data_dir:
            shutil.rmtree(root, ignore_errors=True)
