"""Cases for the admin HTTP apps of the brokers and the NameServer.

Requests are written as raw bytes, so that broken HTTP can be sent too:
random methods on the real routes (filled with fuzz-owned topic and group
names) and on random paths, query parameters with extreme integers, JSON
bodies of random shape, nesting 100 000 deep, bodies of a MiB and more,
declared lengths that do not match, and request lines or headers that are
not HTTP at all. Every request asks for `Connection: close`.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

from chaos.fuzz.plan import Context, Plan
from chaos.fuzz.values import EXTREME_INTS, odd_text, random_value

API = "/api/v1"
ROUTES: tuple[tuple[str, str], ...] = (
    ("GET", "/"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/static/{name}"),
    ("GET", "/reports/{path}"), ("GET", f"{API}/info"), ("GET", f"{API}/reports"),
    ("GET", f"{API}/status"), ("GET", f"{API}/cluster"), ("GET", f"{API}/topics"),
    ("POST", f"{API}/topics"), ("GET", f"{API}/topics/{{topic}}"),
    ("PUT", f"{API}/topics/{{topic}}"), ("DELETE", f"{API}/topics/{{topic}}"),
    ("GET", f"{API}/consumer-groups"), ("GET", f"{API}/consumer-groups/{{group}}"),
    ("POST", f"{API}/consumer-groups/{{group}}/reset-offsets"), ("GET", f"{API}/messages"),
    ("GET", f"{API}/messages/{{msg_id}}"), ("POST", f"{API}/leadership/transfer"),
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT")
_QUERY_KEYS = ("topic", "key", "queue_id", "offset", "limit", "max", "group", "node", "timestamp")
_FIELDS = ("topic", "queues", "perm", "offset", "timestamp_ms", "to", "node_id", "queue_id",
           "offsets", "group")


def _segment(rng: random.Random, ctx: Context, name: str) -> str:
    if name == "topic":
        text = ctx.names.topic(rng)
    elif name == "group":
        text = ctx.names.group(rng)
    elif name == "msg_id":
        text = rng.choice((f"{ctx.group}@{rng.getrandbits(64):016X}", f"x@{rng.getrandbits(70):X}",
                           odd_text(rng), f"{ctx.group}@-1", f"{ctx.group}@FFFFFFFFFFFFFFFF"))
    elif name == "path":
        text = rng.choice(("../../../../etc/passwd", "..%2f..%2fetc%2fpasswd", "x/../../y",
                           odd_text(rng), "a" * 5000))
    else:
        text = odd_text(rng)
    return quote(text, safe=rng.choice(("", "/", "/.%")))


def _path(rng: random.Random, ctx: Context) -> tuple[str, str]:
    if rng.random() < 0.85:
        method, template = rng.choice(ROUTES)
        path = template
        for name in ("topic", "group", "msg_id", "path", "name"):
            path = path.replace("{" + name + "}", _segment(rng, ctx, name))
    else:
        method = rng.choice(METHODS)
        path = rng.choice(("", "/", "//", "/api", f"{API}/", f"{API}//topics", "/" + "a" * 9000,
                           "*", "http://x/", "/%", "/%zz", "/\x00")) + quote(odd_text(rng))
    if rng.random() < 0.3:
        method = rng.choice((*METHODS, odd_text(rng).replace(" ", "") or "X"))
    if rng.random() < 0.4:
        pairs = [f"{quote(rng.choice(_QUERY_KEYS))}="
                 f"{quote(str(rng.choice((*EXTREME_INTS, 2**70, -(2**70), odd_text(rng)))))}"
                 for _ in range(rng.randint(1, 4))]
        path += "?" + "&".join(pairs)
    return method, path


def _json_body(rng: random.Random, ctx: Context) -> bytes:
    roll = rng.random()
    if roll < 0.5:
        body: Any = {rng.choice(_FIELDS): rng.choice((*EXTREME_INTS, odd_text(rng), None, True,
                                                     [], {}, ctx.names.topic(rng)))
                     for _ in range(rng.randint(0, 4))}
    elif roll < 0.7:
        body = random_value(rng, 3)
    elif roll < 0.8:
        depth = rng.choice((1000, 100_000))
        return b"[" * depth + b"]" * depth if rng.random() < 0.5 else \
            b'{"a":' * depth + b"1" + b"}" * depth
    elif roll < 0.9:
        return rng.randbytes(rng.choice((1, 10, 100)))
    else:
        size = rng.choice((1 << 20, (1 << 20) + 1, 3 << 20))
        return b'{"topic": "' + b"x" * size + b'"}'
    try:
        return json.dumps(body, allow_nan=True).encode()
    except (ValueError, TypeError):
        return b"{}"


def _request(rng: random.Random, ctx: Context, method: str, path: str, body: bytes,
             headers: list[str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz", "Connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass") + body


def http_request(rng: random.Random, ctx: Context) -> Plan:
    """A well-formed HTTP/1.1 request on a real or random route, JSON-ish body."""
    method, path = _path(rng, ctx)
    body = _json_body(rng, ctx) if rng.random() < 0.7 else b""
    headers = [f"Content-Type: {rng.choice(('application/json', 'text/plain', '*/*'))}"]
    # aiohttp cancels a handler when the client's EOF arrives first, so most
    # cases keep their write side open and wait for the answer; some do not,
    # to cancel handlers midway.
    half_close = rng.random() < 0.1
    roll = rng.random()
    if roll < 0.8:
        headers.append(f"Content-Length: {len(body)}")
    elif roll < 0.9:
        # Declared longer than sent: the server waits, then sees the EOF.
        headers.append(f"Content-Length: {len(body) + rng.choice((1, 1000, 10**12))}")
        half_close = True
    else:
        headers.append("Transfer-Encoding: chunked")
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    if ctx.admin_token and rng.random() < 0.7:
        headers.append(f"Authorization: Bearer {ctx.admin_token}")
    if rng.random() < 0.15:
        # A Content-Encoding the body does not have: aiohttp inflates the
        # body as it is read, and a body that does not decode is the
        # client's error, not the server's (it was a 500). Drawn last, so
        # the cases of earlier seeds keep their bytes but for this header.
        headers.append(f"Content-Encoding: {rng.choice(('gzip', 'deflate', 'br', 'x-none'))}")
    return Plan([_request(rng, ctx, method, path, body, headers)], requests=1,
                half_close=half_close)


def broken_http(rng: random.Random, ctx: Context) -> Plan:
    """Bytes that are not valid HTTP: random bytes, a bad request line, header
    lines without colons, 64 KiB header values, negative or non-numeric lengths."""
    roll = rng.random()
    if roll < 0.25:
        data = rng.randbytes(rng.choice((1, 16, 300, 5000)))
    elif roll < 0.5:
        data = rng.choice((b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\r\n\r\n",
                           b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n",
                           b"GET / HTTP/1.1\r\n" + b"H: v\r\n" * 500 + b"\r\n",
                           b"GET " + b"/" * 70_000 + b" HTTP/1.1\r\n\r\n"))
    elif roll < 0.75:
        value = rng.choice(("-1", "abc", "1, 2", "99999999999999999999999", " 5", "0x10"))
        data = _request(rng, ctx, "POST", f"{API}/topics", b"{}",
                        [f"Content-Length: {value}", "Content-Type: application/json"])
    else:
        data = _request(rng, ctx, rng.choice(METHODS), "/", b"", ["NoColonHere",
                                                                  "\x00: \x01", ": empty"])
    return Plan([data], requests=1, half_close=rng.random() < 0.5)
