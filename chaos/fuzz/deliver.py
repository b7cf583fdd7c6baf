"""Send one case over one TCP connection and say what came back.

The outcome records what the server did (answered, closed, kept the
connection open past the deadline, refused the connection) and the findings
a single case can prove on its own: a wire answer with status INTERNAL (a bug
on the server by definition, docs/protocol.md), an HTTP 500, an admin
response that served a file from outside its directory, a refused connection
(the server is down). Whether the servers survived and kept their data is the
oracle's job, after the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

from chaos.fuzz.cases import HTTP, RAFT, WIRE
from chaos.fuzz.plan import Plan
from ledgermq.base.errors import ErrorCode, LedgerMQError
from ledgermq.wire.codec import FrameDecoder, decode_response

_READ_CAP = 1 << 20
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")


@dataclass
class Outcome:
    """What one case did. `end`: "eof" (server closed), "reset", "deadline"
    (still open when we gave up), "refused" (no connection), "answered" (every
    expected answer came back and we closed), "cap" (we stopped reading a long
    answer)."""

    end: str = ""
    answers: int = 0
    statuses: list[int] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"end": self.end, "answers": self.answers, "statuses": self.statuses[:16],
                "findings": self.findings, "ms": round(self.seconds * 1000, 1)}


def _wire_answers(data: bytes, out: Outcome) -> None:
    decoder = FrameDecoder()
    try:
        payloads = decoder.feed(data)
    except LedgerMQError:
        out.findings.append("unparseable answer frame")
        return
    for payload in payloads:
        try:
            response = decode_response(payload)
        except LedgerMQError:
            out.findings.append("unparseable answer")
            continue
        out.statuses.append(response.status)
        if response.status == ErrorCode.INTERNAL:
            out.findings.append(f"INTERNAL: {response.error}"[:300])
    out.answers = len(payloads)


def _http_answer(data: bytes, out: Outcome, request: bytes) -> None:
    m = _STATUS_LINE.match(data)
    if not m:
        return
    status = int(m.group(1))
    out.statuses.append(status)
    out.answers = 1
    if status == 500:
        _, _, body = data.partition(b"\r\n\r\n")
        line = request.split(b" HTTP/", 1)[0][:300].decode("utf-8", "replace")
        out.findings.append(f"HTTP 500 ({line}): {body[:300].decode('utf-8', 'replace')}")
    if status == 200 and b"root:x:0:0" in data:
        out.findings.append("served a file from outside the reports directory")


def _enough(kind: str, plan: Plan, data: bytes) -> bool:
    """True when every answer the plan can get has arrived (reading may stop)."""
    if kind != WIRE or not plan.requests:
        return False
    try:
        return len(FrameDecoder(1 << 30).feed(data)) >= plan.requests
    except LedgerMQError:
        return False


async def deliver(host: str, port: int, kind: str, plan: Plan,
                  deadline_s: float = 2.0) -> Outcome:
    """Write the plan's chunks, half-close, read until EOF, enough answers or
    `deadline_s`; the server's side of the story as an `Outcome`."""
    out = Outcome()
    started = time.monotonic()
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        out.end = "refused"
        out.findings.append(f"connection to {host}:{port} refused or timed out")
        out.seconds = time.monotonic() - started
        return out
    data = bytearray()
    try:
        async with asyncio.timeout(deadline_s):
            try:
                for i, chunk in enumerate(plan.chunks):
                    if i and plan.pause_s:
                        await asyncio.sleep(plan.pause_s)
                    writer.write(chunk)
                    await writer.drain()
                if plan.half_close and writer.can_write_eof():
                    writer.write_eof()
            except (ConnectionError, OSError):
                pass  # the server closed on an earlier error: read what it said
            while True:
                if len(data) >= _READ_CAP:
                    out.end = "cap"  # a big answer (a static file): enough of it
                    break
                got = await reader.read(65536)
                if not got:
                    out.end = "eof"
                    break
                data += got
                if _enough(kind, plan, bytes(data)):
                    out.end = "answered"
                    break
    except TimeoutError:
        out.end = "deadline"
    except (ConnectionError, OSError):
        out.end = "reset"
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError, TimeoutError):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
    if kind == WIRE:
        _wire_answers(bytes(data), out)
    elif kind == HTTP:
        _http_answer(bytes(data), out, plan.chunks[0] if plan.chunks else b"")
    elif kind == RAFT and data:
        out.findings.append(f"the Raft port wrote {len(data)} bytes back")
    out.seconds = time.monotonic() - started
    return out
