"""Pieces shared by the broker's and the NameServer's HTTP admin apps (aiohttp).

Both apps speak the same JSON dialect, so the dashboard and `ledgermq status /
topic / group` work against either: errors are `{"error": {"code", "message",
"data"}}` with a matching HTTP status; with authentication on every API
request is signed (signing.py) and writes need an administrator, without it
writes need the configured token if any (`AdminAuth`, docs/security.md, "The admin HTTP API");
`/metrics` serves a prometheus-client registry, `/openapi.json` the API
description, `/` the dashboard (static files in ledgermq/dashboard/) and
`/api/v1/reports` the chaos and audit reports found in a directory.

This module lives in the shared layer because the NameServer may not import
the broker (tests/test_layers.py); it depends on nothing of ours but the error
codes, the name rules and the wire's keys and TLS contexts.
"""

from __future__ import annotations

import base64
import errno
import hmac
import json
import logging
import mimetypes
import os
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)

from commitlog.message import valid_topic
from ledgermq.base.address import split_host_port
from ledgermq.base.errors import ErrorCode, LedgerMQError
from ledgermq.base.exposure import check_exposure
from ledgermq.webadmin.openapi import COMMON_OPERATIONS, operations
from ledgermq.webadmin.signing import SCHEME, SignatureError, Verifier
from ledgermq.wire.auth import ANONYMOUS, KeyStore, Principal
from ledgermq.wire.tls import server_context

log = logging.getLogger(__name__)

# `_created` series double every counter and histogram for a timestamp no
# dashboard here uses; the servers that import this module do not export them.
# The cast: prometheus_client declares this function without annotations.
cast(Callable[[], None], disable_created_metrics)()

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
API = "/api/v1"
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})

# Wire error code -> HTTP status. NOT_LEADER is a conflict with the cluster's
# state (retry at the leader named in `data`), not a client mistake.
_HTTP_STATUS: dict[int, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.OFFSET_OUT_OF_RANGE: 400,
    ErrorCode.OFFSET_MOVED: 400,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.NO_PERMISSION: 403,
    ErrorCode.UNKNOWN_TOPIC: 404,
    ErrorCode.UNKNOWN_BROKER: 404,
    ErrorCode.NOT_LEADER: 409,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.DISK_FULL: 507,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.OUTCOME_UNKNOWN: 504,
}


class ApiError(Exception):
    """An HTTP answer with a JSON error body."""

    def __init__(self, status: int, code: str, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.data = data


def error_body(code: str, message: str, data: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "data": data}}


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=_default), status=status,
                        content_type="application/json")


def from_ledgermq_error(exc: LedgerMQError) -> ApiError:
    try:
        name = ErrorCode(exc.code).name
    except ValueError:
        name = f"ERROR_{exc.code}"
    return ApiError(_HTTP_STATUS.get(exc.code, 500), name, exc.message, exc.data)


@web.middleware
async def error_middleware(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    """Every failure of an API route becomes a JSON error with a fitting status."""
    try:
        return await handler(request)
    except ApiError as exc:
        return json_response(error_body(exc.code, exc.message, exc.data), exc.status)
    except LedgerMQError as exc:
        err = from_ledgermq_error(exc)
        return json_response(error_body(err.code, err.message, err.data), err.status)
    except RequestPayloadError as exc:
        # The body could not be read as sent: a Content-Encoding it does not
        # have (gzip that is not gzip), or a body cut short. The client's
        # fault, not ours.
        reason = re.sub(r"^\d{3}, message: ", "", " ".join(str(exc).split()))
        return json_response(error_body("INVALID_REQUEST",
                                        f"the request body cannot be read: {reason}"), 400)
    except web.HTTPException as exc:
        if not request.path.startswith("/api/") or exc.status < 400:
            raise
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status, "HTTP_ERROR")
        message = f"{request.method} {request.path}: {exc.reason}"
        return json_response(error_body(code, message), exc.status)
    except OSError as exc:
        if request.path.startswith("/static/") and exc.errno == errno.ENAMETOOLONG:
            # aiohttp's static route stats the asked-for name as is: a name no
            # file system can hold is simply not there.
            return json_response(error_body("NOT_FOUND", f"{request.method} static file not "
                                            "found"), 404)
        log.exception("admin %s %s failed", request.method, request.path)
        return json_response(error_body("INTERNAL", f"{type(exc).__name__}: {exc}"), 500)
    except Exception as exc:
        log.exception("admin %s %s failed", request.method, request.path)
        return json_response(error_body("INTERNAL", f"{type(exc).__name__}: {exc}"), 500)


@dataclass(frozen=True)
class AdminAuth:
    """Who may call an admin app (docs/security.md, "The admin HTTP API").

    `keys` set (the server has a cluster secret): auth is on, and every /api
    request must be signed (signing.py) by a key it knows; writes need an
    admin principal. `keys` None: auth is off, requests are anonymous, and
    `token` (the pre-signing `admin_token`) guards writes when set.
    `metrics_auth`: /metrics and /reports/ need a signature too (default: they
    stay readable, like the dashboard's static files, for scrapers).
    """

    keys: KeyStore | None = None
    token: str = ""
    metrics_auth: bool = False

    @property
    def on(self) -> bool:
        return self.keys is not None


# Who sent the request, set by auth_middleware: request[PRINCIPAL].
PRINCIPAL = web.RequestKey("principal", Principal)


def may_write(principal: Principal) -> bool:
    """The admin API's write policy, the wire's admin operations' too: an
    administrator, or a cluster member (the NameServer's admin app forwarding
    a write it already authorised)."""
    return principal.admin or principal.cluster_member


# Routes anyone may read, decided by the route the router matched (one rule
# with the router, whatever the path's spelling): the dashboard's page and
# files and the API description; /metrics and report files too unless
# metrics_auth.
_ALWAYS_PUBLIC = frozenset({"/", "/openapi.json", "/static"})
_METRICS_ROUTES = frozenset({"/metrics", "/reports/{path}"})


def _public(request: web.Request, metrics_auth: bool) -> bool:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else ""
    return route in _ALWAYS_PUBLIC or (not metrics_auth and route in _METRICS_ROUTES)


def auth_middleware(auth: AdminAuth, failures: Counter | None = None
                    ) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Authenticate each request and enforce the write policy. Sets
    request[PRINCIPAL]. A refusal is a JSON 401 (no or bad credentials) or
    403 (authenticated, not allowed), logged as one WARNING line (peer and
    access key, never a signature) and counted in `failures` by reason."""
    verifier = Verifier(auth.keys) if auth.keys is not None else None

    def refuse(request: web.Request, reason: str, message: str, access_key: str = ""
               ) -> ApiError:
        log.warning("admin auth refused %s %s from %s (access key %r): %s", request.method,
                    request.path, request.remote, access_key, reason)
        if failures is not None:
            failures.labels("admin", reason).inc()
        if reason == "replay_cache_full":  # the signature was good: retrying later works
            return ApiError(429, "TOO_MANY_REQUESTS", message)
        return ApiError(401, "UNAUTHENTICATED", message)

    @web.middleware
    async def check(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        write = request.method in WRITE_METHODS
        principal = ANONYMOUS
        if verifier is not None and not _public(request, auth.metrics_auth):
            header = request.headers.get("Authorization", "")
            if not header:
                raise refuse(request, "missing", "this admin API requires signed requests"
                             f" ({SCHEME}; see docs/security.md): give an access key and"
                             " its secret (--access-key/--secret-file)")
            if header.lower().startswith("bearer "):
                raise refuse(request, "bearer", "admin tokens are not accepted when"
                             f" authentication is on: sign requests with {SCHEME}")
            body = await request.read()  # kept by aiohttp for the handler
            path, _, query = request.raw_path.partition("?")
            try:
                principal = verifier.verify(header, request.method, path, query, body)
            except SignatureError as exc:
                raise refuse(request, exc.reason, exc.message, exc.access_key) from None
            if write and request.path.startswith("/api/") and not may_write(principal):
                log.warning("admin auth refused %s %s from %s: %r is not an administrator",
                            request.method, request.path, request.remote, principal.name)
                if failures is not None:
                    failures.labels("admin", "forbidden").inc()
                raise ApiError(403, "NO_PERMISSION", f"{principal.name!r} may not change the"
                               " cluster: this needs an administrator")
        elif verifier is None and auth.token and write and request.path.startswith("/api/"):
            given = request_token(request)
            if not given:
                raise ApiError(401, "TOKEN_REQUIRED",
                               "this admin API requires a token for writes:"
                               " send 'Authorization: Bearer <token>'")
            if not hmac.compare_digest(given.encode(), auth.token.encode()):
                raise ApiError(403, "TOKEN_INVALID", "the admin token is wrong")
        request[PRINCIPAL] = principal
        return await handler(request)

    return check


def request_token(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("X-Admin-Token", "").strip()


def auth_failures(registry: CollectorRegistry) -> Counter:
    """The refusals counter of an admin app, in its server's registry."""
    return Counter("ledgermq_auth_failures_total",
                   "Requests refused for want of valid credentials, by port and reason.",
                   ("port", "reason"), registry=registry)


def checked_name(name: str, what: str) -> str:
    """`name` if it is a valid topic or group name (1-127 of [A-Za-z0-9_%|-]),
    else 400: nothing else is ever looked up or forwarded into another
    server's path."""
    if not valid_topic(name):
        raise ApiError(400, "INVALID_REQUEST",
                       f"invalid {what} name {name[:200]!r}: 1-127 characters of"
                       " [A-Za-z0-9_%|-]")
    return name


def path_name(request: web.Request, key: str) -> str:
    """The topic or consumer group name `key` of the path, checked."""
    return checked_name(request.match_info[key], key)


def message_id(request: web.Request) -> tuple[str, int]:
    """(broker group, physical offset) of the path's `<group>@<16 hex>` id; 400 otherwise."""
    msg_id = request.match_info["msg_id"]
    group, sep, hex_offset = msg_id.rpartition("@")
    if not (sep and valid_topic(group) and len(hex_offset) == 16
            and all(c in "0123456789abcdefABCDEF" for c in hex_offset)):
        raise ApiError(400, "INVALID_REQUEST",
                       f"malformed message id {msg_id[:200]!r}: expected <group>@<16 hex digits>")
    return group, int(hex_offset, 16)


def check_app_exposure(what: str, host: str, auth: AdminAuth, allow_open: bool) -> None:
    """The start-up rule of every port (ledgermq.base.exposure) for an admin app."""
    check_exposure({what: host}, authenticated=auth.on, allow_open=allow_open,
                   remedy="configure a cluster secret (cluster_secret_file) or set "
                          "allow_open to run open")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body; 400 for anything else."""
    raw = await request.read()
    if not raw:
        raise ApiError(400, "INVALID_JSON", "the request needs a JSON object body")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "INVALID_JSON", f"malformed JSON body: {exc}") from None
    except RecursionError:  # a body nested deeper than the decoder's stack
        raise ApiError(400, "INVALID_JSON", "the JSON body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "INVALID_JSON", "the JSON body must be an object")
    return body


def field(body: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    """body[key] checked against `kind` (bool is not an int); 400 names the field."""
    value = body.get(key, default)
    if value is ... or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ApiError(400, "INVALID_REQUEST",
                       f"field {key!r} is required and must be {kind.__name__}")
    return value


def int_param(request: web.Request, key: str, default: int, lo: int = 0,
              hi: int = 2**63 - 1) -> int:
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "INVALID_REQUEST", f"query parameter {key!r} must be an integer") \
            from None
    if not lo <= value <= hi:
        raise ApiError(400, "INVALID_REQUEST", f"query parameter {key!r} must be in [{lo}, {hi}]")
    return value


# ------------------------------------------------------------------ reports

REPORT_SUFFIXES = (".html", ".json", ".md", ".txt", ".png", ".svg", ".csv", ".log", ".prom")


def list_reports(directory: str, limit: int = 500) -> list[dict[str, Any]]:
    """Chaos runs (a directory with results.json / index.html, chaos/report.py)
    and audit reports (files) under `directory`, newest first. Each has the
    relative `path` of its main file for /reports/<path>."""
    if not directory or not os.path.isdir(directory):
        return []
    root = Path(directory)
    found: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        names = set(filenames)
        if "latest.json" in names and "nights" in dirnames:
            # A nightly audit's state directory (ledgermq audit --nightly --state):
            # one entry, its cross-night page; its nights are linked from there.
            # Other reports beside them are still listed.
            main = "index.html" if "index.html" in names else "latest.json"
            info = _report_entry(root, here / main, "audit")
            if here == root:
                info["name"] = "nightly audit"
            info["files"] = sorted(n for n in names if n.endswith(REPORT_SUFFIXES))
            found.append(info)
            dirnames.remove("nights")
            continue
        if "index.html" in names or "results.json" in names:
            main = "index.html" if "index.html" in names else "results.json"
            info = _report_entry(root, here / main, "chaos" if "results.json" in names
                                 else "report")
            info["files"] = sorted(n for n in names if n.endswith(REPORT_SUFFIXES))
            summary = _chaos_summary(here / "results.json")
            if summary:
                info["summary"] = summary
            found.append(info)
            dirnames[:] = []  # a run's own files are listed with it
            continue
        for name in sorted(names):
            if name.endswith((".html", ".json", ".md", ".txt")):
                kind = "audit" if "audit" in name.lower() else "report"
                found.append(_report_entry(root, here / name, kind))
        if len(found) >= limit:
            break
    found.sort(key=lambda r: r["modified_ms"], reverse=True)
    return found[:limit]


def _report_entry(root: Path, path: Path, kind: str) -> dict[str, Any]:
    stat = path.stat()
    rel = path.relative_to(root).as_posix()
    return {"name": str(Path(rel).parent) if path.name in ("index.html", "results.json")
            and Path(rel).parent != Path(".") else rel,
            "kind": kind, "path": rel, "size": stat.st_size,
            "modified_ms": int(stat.st_mtime * 1000)}


def _chaos_summary(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    keep = ("valid", "ok", "verdict", "workload", "nemesis", "ops", "anomalies", "seed")
    return {k: doc[k] for k in keep if k in doc and not isinstance(doc[k], (dict, list))}


def report_file(directory: str, rel: str) -> Path:
    """The file `rel` under `directory`; 404 for anything outside it."""
    if not directory:
        raise ApiError(404, "NOT_FOUND", "no reports directory is configured")
    root = Path(directory).resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise ApiError(404, "NOT_FOUND", f"no report file {rel!r}")
    return target


def add_common_routes(app: web.Application, *, registry: CollectorRegistry,
                      openapi: dict[str, Any], reports_dir: str, kind: str) -> None:
    """/metrics, /openapi.json, the dashboard and the reports pages."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def spec(request: web.Request) -> web.Response:
        return json_response(openapi)

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(DASHBOARD_DIR / "index.html")

    async def reports(request: web.Request) -> web.Response:
        return json_response({"directory": reports_dir or None,
                              "reports": list_reports(reports_dir)})

    async def report(request: web.Request) -> web.StreamResponse:
        target = report_file(reports_dir, request.match_info["path"])
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return web.FileResponse(target, headers={"Content-Type": ctype})

    async def info(request: web.Request) -> web.Response:
        return json_response({"kind": kind, "time_ms": int(time.time() * 1000)})

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", spec)
    app.router.add_get("/", index)
    app.router.add_static("/static/", DASHBOARD_DIR)
    app.router.add_get(f"{API}/info", info)
    app.router.add_get(f"{API}/reports", reports)
    app.router.add_get("/reports/{path:.+}", report)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_operations(app: web.Application, kind: str, handlers: Mapping[str, Handler]) -> None:
    """Route each operation of the OpenAPI table (`openapi.operations(kind)`)
    to its handler, named by operation: the table is the one list of routes, so
    the document and the router cannot drift apart. A server that gives a
    handler the table does not list for it, or misses one, fails at start."""
    wanted = {op.name for op in operations(kind)} - COMMON_OPERATIONS
    if set(handlers) != wanted:
        raise ValueError(f"{kind} admin handlers do not match the API table: "
                         f"missing {sorted(wanted - set(handlers))}, "
                         f"unknown {sorted(set(handlers) - wanted)}")
    for op in operations(kind):
        if op.name not in COMMON_OPERATIONS:
            app.router.add_route(op.method.upper(), op.path, handlers[op.name])


def make_app(auth: AdminAuth, failures: Counter | None = None) -> web.Application:
    return web.Application(middlewares=[error_middleware, auth_middleware(auth, failures)],
                           client_max_size=1 << 20)


async def start_site(app: web.Application, host: str, port: int,
                     ssl_context: ssl.SSLContext | None = None, advertise_host: str = ""
                     ) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0 picks a port), over TLS with `ssl_context`;
    (runner, base URL: see `site_url`)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    addresses = runner.addresses  # the bound sockets' names: port 0 became a real port
    bound = addresses[0][1] if addresses else port
    return runner, site_url(ssl_context is not None, host, bound, advertise_host)


def site_url(tls: bool, host: str, port: int, advertise_host: str = "") -> str:
    """The URL others reach an app listening on host:port by. A wildcard listen
    (every interface: a container) is reached at `advertise_host`, the host this
    node is known by (a broker's [peers] entry), else at 127.0.0.1."""
    wildcard = host in ("0.0.0.0", "::", "")
    shown = (advertise_host or "127.0.0.1") if wildcard else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext | None:
    """The admin app's TLS context when a certificate is configured. Client
    certificates are not asked for: browsers and the CLI authenticate with
    signed requests (the wire ports' mutual TLS is theirs alone)."""
    if not cert_file:
        return None
    return server_context(cert_file, key_file)


async def wire_request(address: str, code: int, body: Any = None,
                       timeout: float = 1.0, *, credentials: Any = None,
                       tls: Any = None) -> Any:
    """One request over the wire protocol to `address`; raises on failure.
    `credentials` (wire.auth.Credentials), `tls` (an ssl.SSLContext): for
    brokers with authentication and TLS on (docs/security.md)."""
    from ledgermq.wire import RpcClient

    host, port = split_host_port(address)
    client = await RpcClient.connect(host, port, role="admin", timeout=timeout,
                                     credentials=credentials, ssl=tls)
    try:
        return await client.request(code, body, timeout=timeout)
    finally:
        await client.close()


async def wire_status(address: str, timeout: float = 1.0, *, credentials: Any = None,
                      tls: Any = None) -> dict[str, Any] | None:
    """BROKER_STATUS of the node at `address`, None if it does not answer."""
    from ledgermq.base.codes import RequestCode

    try:
        status: dict[str, Any] = await wire_request(address, RequestCode.BROKER_STATUS, None,
                                                    timeout, credentials=credentials, tls=tls)
    except Exception:  # unreachable, closed, timed out: all mean "no status"
        return None
    return status


def node_row(node_id: str, address: str, status: dict[str, Any] | None,
             registered_role: str | None = None) -> dict[str, Any]:
    """One node of the cluster view (the same shape from a broker and a NameServer)."""
    row: dict[str, Any] = {"node_id": node_id, "address": address,
                           "registered_role": registered_role, "reachable": status is not None}
    if status is not None:
        for key in ("role", "term", "leader_id", "leader_ready", "last_index", "commit_index",
                    "applied_index", "durable_index", "admin_url", "flush", "replicate",
                    "topics", "elections", "leader_changes"):
            row[key] = status.get(key)
        followers = status.get("followers")
        if status.get("role") == "leader" and isinstance(followers, dict):
            row["followers"] = {str(k): {"match": v.get("match"), "lag": v.get("lag")}
                                for k, v in followers.items()}
    return row


def group_view(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Leader, term and per-node lag of one group's rows (lag: commit index of the
    most advanced node minus the node's applied index)."""
    live = [r for r in rows if r["reachable"]]
    top = max((r.get("commit_index") or 0 for r in live), default=0)
    for r in rows:
        r["lag"] = top - (r.get("applied_index") or 0) if r["reachable"] else None
    leaders = [r for r in live if r.get("role") == "leader"]
    leader = max(leaders, key=lambda r: r.get("term") or 0) if leaders else None
    return {"leader": leader["node_id"] if leader else None,
            "term": max((r.get("term") or 0 for r in live), default=0),
            "leader_admin_url": leader.get("admin_url") if leader else None,
            "nodes": rows}


# ------------------------------------------------------------------ client

DEFAULT_ADMIN_URL = "http://127.0.0.1:9877"


class AdminApiError(Exception):
    """An error answer of the admin API, as the CLI shows it (the client is
    ledgermq.client.admin.AdminApi)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
