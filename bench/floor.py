"""The floor of LedgerMQ's W=1 topology in Python, as JSON: what a message
costs when the nodes do nothing but move it.

Four processes on loopback, as in the side-by-side kit: one client sends a
1 KiB body, waits for the answer and sends the next (W=1); a "leader" writes
it to a file (`os.pwrite`, and `os.fdatasync` with `--flush sync`) and
forwards it to two "followers", which write it the same way and acknowledge;
the leader answers the client at the first acknowledgement. Every process
runs the event loop LedgerMQ runs (uvloop when installed), reads with an
`asyncio.Protocol` and frames with a 4-byte length, as LedgerMQ's transports
do. No Raft, no request checks, no apply, no ConsumeQueue: the figures are
the interpreter's, the loop's and the kernel's share of a message, the part
of LedgerMQ's per-message cost that no change to its own code can remove.

    python bench/floor.py [--seconds 6] [--rounds 3] [--flush async,sync] [--body-bytes 1024]

Prints one JSON document: per flush setting and round, msgs/s, p50/p99
latency and CPU microseconds per message of each process (`servers` is the
three nodes summed, what bench/produce.py and the kit report for LedgerMQ).
Everything binds 127.0.0.1 and the children are stopped by their PIDs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledgermq.base import loop  # noqa: E402

_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">Q")


class Framed(asyncio.Protocol):
    """Length-prefixed frames; `on_frame(self, payload)` for each whole one."""

    def __init__(self, on_frame: Callable[[Framed, bytes], None]) -> None:
        self._buffer = bytearray()
        self._on_frame = on_frame
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            length = _LENGTH.unpack_from(buffer)[0]
            if len(buffer) < 4 + length:
                return
            payload = bytes(buffer[4:4 + length])
            del buffer[:4 + length]
            self._on_frame(self, payload)

    def send(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_LENGTH.pack(len(payload)) + payload)


class Disk:
    """Appends to one file, fdatasynced after each write with flush=sync."""

    def __init__(self, directory: str, sync: bool) -> None:
        self.fd = os.open(os.path.join(directory, f"log-{os.getpid()}"),
                          os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.end = 0
        self.sync = sync

    def append(self, data: bytes) -> None:
        os.pwrite(self.fd, data, self.end)
        self.end += len(data)
        if self.sync:
            os.fdatasync(self.fd)


async def follower(disk: Disk) -> None:
    def on_frame(conn: Framed, payload: bytes) -> None:
        disk.append(payload)
        conn.send(payload[:8])  # the acknowledgement: the message's sequence number

    await serve(on_frame)


async def leader(disk: Disk, follower_ports: list[int]) -> None:
    running = asyncio.get_running_loop()
    answered: dict[bytes, bool] = {}  # sequence -> answered (first ack in)
    client: list[Framed] = []

    def on_ack(conn: Framed, payload: bytes) -> None:
        if answered.get(payload) is False:
            answered[payload] = True
            client[0].send(payload)
        else:
            answered.pop(payload, None)  # the second acknowledgement

    followers: list[Framed] = []
    for port in follower_ports:
        _, conn = await running.create_connection(lambda: Framed(on_ack), "127.0.0.1", port)
        followers.append(conn)

    def on_frame(conn: Framed, payload: bytes) -> None:
        if not client:
            client.append(conn)
        # Forwarded first, then written: the followers write meanwhile.
        for f in followers:
            f.send(payload)
        disk.append(payload)
        answered[payload[:8]] = False

    await serve(on_frame)


async def serve(on_frame: Callable[[Framed, bytes], None]) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: Framed(on_frame), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)  # the parent reads the port
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF


async def send(port: int, seconds: float, body_bytes: int) -> tuple[int, list[float], float]:
    running = asyncio.get_running_loop()
    waiter: list[asyncio.Future[bytes]] = []

    def on_answer(conn: Framed, payload: bytes) -> None:
        waiter[0].set_result(payload)

    _, conn = await running.create_connection(lambda: Framed(on_answer), "127.0.0.1", port)
    body = b"x" * body_bytes
    latencies = []
    sent = 0
    started = time.monotonic()
    while (now := time.monotonic()) - started < seconds:
        waiter[:] = [running.create_future()]
        conn.send(_SEQ.pack(sent) + body)
        await waiter[0]
        latencies.append(time.monotonic() - now)
        sent += 1
    elapsed = time.monotonic() - started
    assert conn.transport is not None
    conn.transport.close()
    return sent, latencies, elapsed


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_node(directory: str, flush: str, role: str, ports: list[int]) -> tuple[Any, int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--node", role, "--dir", directory, "--flush", flush,
         *(["--followers", ",".join(map(str, ports))] if ports else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def one_round(flush: str, seconds: float, body_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lmq-floor-") as directory:
        procs: dict[str, Any] = {}
        try:
            procs["follower_1"], port_1 = start_node(directory, flush, "follower", [])
            procs["follower_2"], port_2 = start_node(directory, flush, "follower", [])
            procs["leader"], port = start_node(directory, flush, "leader", [port_1, port_2])
            before = {name: cpu_seconds(p.pid) for name, p in procs.items()}
            client_before = own_cpu_seconds()
            sent, latencies, elapsed = loop.run(send(port, seconds, body_bytes))
            cpu = {name: cpu_seconds(p.pid) - before[name] for name, p in procs.items()}
            cpu["client"] = own_cpu_seconds() - client_before
        finally:
            for proc in procs.values():
                proc.stdin.close()  # the node's serve() returns at EOF
            for proc in procs.values():
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    latencies.sort()
    per_msg = {name: round(s / sent * 1e6, 1) for name, s in sorted(cpu.items())}
    per_msg["servers"] = round(sum(v for k, v in per_msg.items() if k != "client"), 1)
    return {"msgs_per_s": round(sent / elapsed), "p50_ms": round(latencies[len(latencies) // 2]
                                                               * 1e3, 3),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3),
            "cpu_us_per_msg": per_msg}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flush", default="async,sync", help="comma-separated: async, sync")
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--node", choices=("leader", "follower"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--followers", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    flushes = args.flush.split(",")
    if any(f not in ("async", "sync") for f in flushes):
        parser.error("--flush takes async, sync or both")
    if args.node:  # a child: one node until its stdin closes
        disk = Disk(args.dir, args.flush == "sync")
        ports = [int(p) for p in args.followers.split(",") if p]
        loop.run(leader(disk, ports) if args.node == "leader" else follower(disk))
        return
    rounds = {f: [one_round(f, args.seconds, args.body_bytes) for _ in range(args.rounds)]
              for f in flushes}
    print(json.dumps({"bench": "floor", "topology": "client -> leader -> 2 followers, W=1",
                      "body_bytes": args.body_bytes, "seconds": args.seconds,
                      "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
