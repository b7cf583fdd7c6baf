"""Independent producers for bench/produce.py: N processes, one message at a time each.

The normal deployment is many client processes, each with its own connection
and nothing to merge on the client side: whatever batching happens is the
broker's (its group commit puts requests that arrive together into one Raft
entry). `ProducerProcesses` starts N copies of this script as workers; each
builds its own `Producer`, warms its route and connection, says `ready`, and
then for every `run SECONDS` line on its stdin sends one message after the
other for that long and answers one JSON line: acknowledged messages, their
latencies (ms) and the CPU seconds the worker spent.

    python bench/producer_procs.py --namesrv HOST:PORT --topic bench \
        [--access-key KEY --secret-file FILE] [--ca-file CA.pem]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledgermq.base import loop
from ledgermq.client import Producer
from ledgermq.wire.auth import Credentials, read_secret_file

BODY = b"x" * 1024
WORKER = Path(__file__).resolve()


class ProducerProcesses:
    """N worker processes sending to one topic; `run` measures one slice."""

    def __init__(self, count: int, namesrv: str, topic: str, extra: list[str] | None = None
                 ) -> None:
        self.count = count
        self.argv = [sys.executable, str(WORKER), "--namesrv", namesrv, "--topic", topic,
                     *(extra or [])]
        self.procs: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def start(self, timeout: float = 120.0) -> None:
        env = dict(os.environ, PYTHONPATH=str(WORKER.parents[1]))
        for _ in range(self.count):
            self.procs.append(await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=env))
        async with asyncio.timeout(timeout):
            for proc in self.procs:
                assert proc.stdout is not None
                line = await proc.stdout.readline()
                if line.strip() != b"ready":
                    raise RuntimeError(f"producer worker {proc.pid} did not start: {line!r}")

    async def run(self, seconds: float) -> list[dict[str, Any]]:
        """Every worker sends for `seconds`; their reports."""
        command = f"run {seconds}\n".encode()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(command)
        await asyncio.gather(*(p.stdin.drain() for p in self.procs if p.stdin is not None))
        reports = []
        for proc in self.procs:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"producer worker {proc.pid} exited")
            reports.append(json.loads(line))
        return reports

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
        for proc in self.procs:
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.procs = []


async def worker(args: argparse.Namespace) -> None:
    credentials = None
    if args.access_key:
        credentials = Credentials(args.access_key, read_secret_file(args.secret_file))
    tls = None
    if args.ca_file:
        from ledgermq.wire.tls import client_context
        tls = client_context(args.ca_file)
    producer = Producer([args.namesrv], credentials=credentials, tls=tls)
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        for _ in range(3):  # route and connection, outside any measurement
            await producer.send(args.topic, BODY)
        print("ready", flush=True)
        while line := await reader.readline():
            seconds = float(line.split()[1])
            latencies: list[float] = []
            cpu = time.process_time()
            started = time.monotonic()
            deadline = started + seconds
            while time.monotonic() < deadline:
                sent = time.monotonic()
                await producer.send(args.topic, BODY)
                latencies.append(round((time.monotonic() - sent) * 1000, 3))
            print(json.dumps({"acked": len(latencies), "latencies_ms": latencies,
                              "elapsed_s": time.monotonic() - started,
                              "cpu_s": time.process_time() - cpu}), flush=True)
    finally:
        await producer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--access-key", default="")
    parser.add_argument("--secret-file", default="")
    parser.add_argument("--ca-file", default="")
    loop.run(worker(parser.parse_args()))
