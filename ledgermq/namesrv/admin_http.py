"""The NameServer's HTTP admin app: the cluster-wide entry point.

Same API as a broker's admin app (ledgermq/openapi.py), for every group at
once. The cluster view comes from the route registry plus each registered
node's BROKER_STATUS over the wire protocol (1 s timeout per node, in
parallel), so a dead node shows up as unreachable instead of hiding the rest.
Everything else is forwarded over HTTP to the brokers' admin apps (their URLs
come from those statuses): reads to the group's leader or, failing that, any
node that answers; writes to the leader. Forwarded requests are signed as a
cluster member (CLUSTER_KEY and the cluster secret) once this app has
authorised the caller itself (docs/security.md, "The admin HTTP API"); without a cluster
secret the caller's admin token, if any, is passed on. Path parameters are
checked to be valid names before anything is forwarded (a `..%2F..%2Fx` topic
is a 400 here, never a path on a broker).

`/api/v1/audit` answers the nightly consistency audit's latest verdict from
the reports directory (namesrv/audit_verdict.py; the same verdict is on
/metrics and the dashboard's banner).

This is what the dashboard and the CLI talk to: it is not a broker, so killing
any broker leaves the page and the commands working (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp import web
from yarl import URL

from ledgermq.base.address import split_host_port
from ledgermq.base.clock import monotonic_ms
from ledgermq.namesrv.audit_verdict import DEFAULT_STALE_AFTER_S, NoAudit, read_verdict
from ledgermq.namesrv.metrics import namesrv_registry
from ledgermq.namesrv.view import NameServerView
from ledgermq.webadmin.app import (
    API,
    AdminAuth,
    ApiError,
    add_common_routes,
    add_operations,
    auth_failures,
    check_app_exposure,
    checked_name,
    field,
    group_view,
    json_response,
    make_app,
    message_id,
    node_row,
    path_name,
    read_json,
    request_token,
    start_site,
    tls_context,
    wire_status,
)
from ledgermq.webadmin.openapi import openapi_document
from ledgermq.webadmin.signing import StaticKeyStore, authorization
from ledgermq.wire.auth import CLUSTER_KEY, CLUSTER_MEMBER, Credentials, Principal
from ledgermq.wire.tls import client_context

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 1.0
FORWARD_TIMEOUT = 15.0


@dataclass(frozen=True)
class AdminSecurity:
    """How the NameServer's admin app authenticates (docs/security.md, "The admin HTTP API").

    `cluster_secret`: authentication on; the cluster key is known, and
    forwarded requests are signed with it. `admin`: the administrator's
    credentials from the command line (`--admin-access-key/--admin-secret-file`),
    the only user a NameServer knows (users of the replicated ACL live in the
    brokers). `token`: the pre-signing admin token, used only without a
    cluster secret. `tls_ca_file` verifies brokers' https admin apps.
    """

    cluster_secret: bytes | None = None
    admin: Credentials | None = None
    token: str = ""
    allow_open: bool = False
    metrics_auth: bool = False
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""

    def auth(self) -> AdminAuth:
        if self.cluster_secret is None:
            return AdminAuth(token=self.token, metrics_auth=self.metrics_auth)
        keys = {CLUSTER_KEY: (self.cluster_secret, CLUSTER_MEMBER)}
        if self.admin is not None:
            keys[self.admin.access_key] = (self.admin.secret,
                                           Principal(self.admin.access_key, admin=True))
        return AdminAuth(keys=StaticKeyStore(keys), metrics_auth=self.metrics_auth)

    @property
    def member(self) -> Credentials | None:
        """What forwarded requests are signed with."""
        if self.cluster_secret is None:
            return None
        return Credentials(CLUSTER_KEY, self.cluster_secret)


class NameServerAdmin:
    """`await start()` binds the app; `await close()` stops it."""

    def __init__(self, server: NameServerView, listen: str, *, reports_dir: str = "",
                 security: AdminSecurity | None = None,
                 wire_tls: ssl.SSLContext | None = None,
                 audit_stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self.server = server
        self.listen = listen
        self.reports_dir = reports_dir
        self.audit_stale_after_s = audit_stale_after_s
        self.security = security or AdminSecurity()
        # What the BROKER_STATUS queries authenticate with (the cluster key)
        # and verify the brokers' client ports with, when those are on.
        self.credentials, self.tls = self.security.member, wire_tls
        self.auth = self.security.auth()
        self.registry = namesrv_registry(server, reports_dir, audit_stale_after_s)
        self.runner: web.AppRunner | None = None
        self.url: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | bool = (client_context(self.security.tls_ca_file)
                                            if self.security.tls_ca_file else True)
        self.app = make_app(self.auth, auth_failures(self.registry))
        add_common_routes(self.app, registry=self.registry,
                          openapi=openapi_document("namesrv"), reports_dir=reports_dir,
                          kind="namesrv")
        add_operations(self.app, "namesrv", {
            "cluster": self.cluster, "topics": self.topics, "create_topic": self.create_topic,
            "describe_topic": self.describe_topic, "update_topic": self.change_topic,
            "delete_topic": self.change_topic, "consumer_groups": self.consumer_groups,
            "consumer_group": self.consumer_group, "reset_offsets": self.reset_offsets,
            "messages_by_key": self.messages_by_key, "message_by_id": self.message_by_id,
            "transfer_leadership": self.transfer_leadership, "retention": self.retention,
            "retention_trim": self.retention_trim, "members": self.members,
            "change_members": self.change_members, "audit": self.audit,
        })

    async def start(self) -> str:
        host, port = split_host_port(self.listen)
        check_app_exposure("NameServer admin app", host, self.auth, self.security.allow_open)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT))
        self.runner, self.url = await start_site(
            self.app, host, port,
            tls_context(self.security.tls_cert_file, self.security.tls_key_file))
        return self.url

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ cluster view

    async def _groups(self) -> dict[str, Any]:
        view = self.server.registry.cluster(monotonic_ms())
        out: dict[str, Any] = {}
        for name, info in sorted(view.get("groups", {}).items()):
            nodes = info.get("nodes", [])
            statuses = await asyncio.gather(
                *(wire_status(n["address"], STATUS_TIMEOUT, credentials=self.credentials,
                              tls=self.tls) for n in nodes))
            rows = [node_row(n["node_id"], n["address"], st, n.get("role"))
                    for n, st in zip(nodes, statuses, strict=True)]
            group = group_view(rows)
            group["cluster"] = info.get("cluster")
            group["registered_leader"] = info.get("leader")
            group["registered_leader_term"] = info.get("leader_term")
            # The configuration as the leader registered it (voters,
            # learners, CONFIG index); absent until one is known.
            group["membership"] = info.get("membership")
            out[name] = group
        return out

    async def cluster(self, request: web.Request) -> web.Response:
        return json_response({"source": "namesrv", "groups": await self._groups()})

    @staticmethod
    def _urls(group: dict[str, Any], leader_only: bool) -> list[str]:
        """Admin URLs of a group's nodes: the leader first, then the others."""
        urls = []
        if group.get("leader_admin_url"):
            urls.append(group["leader_admin_url"])
        if not leader_only:
            urls += [n["admin_url"] for n in group["nodes"]
                     if n.get("reachable") and n.get("admin_url")
                     and n["admin_url"] not in urls]
        return urls

    # -------------------------------------------------------------- forwarding

    async def _call(self, request: web.Request, url: str, method: str, path: str,
                    body: Any = None, timeout: float = FORWARD_TIMEOUT) -> tuple[int, Any]:
        assert self._session is not None
        query = request.rel_url.raw_query_string
        target = f"{url}{path}" + (f"?{query}" if query and method == "GET" else "")
        data = json.dumps(body).encode() if body is not None else b""
        headers = {"Content-Type": "application/json"} if data else {}
        member = self.security.member
        if member is not None:
            # This app authorised the caller; the broker is told by a member.
            parts = urlsplit(target)
            headers["Authorization"] = authorization(member, method, parts.path, parts.query,
                                                     data)
        elif token := request_token(request):
            headers["Authorization"] = f"Bearer {token}"
        # encoded=True: the request goes out exactly as signed.
        async with self._session.request(method, URL(target, encoded=True), data=data or None,
                                         headers=headers, ssl=self._ssl,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                answer = {"error": {"code": "BAD_GATEWAY", "message": await resp.text()}}
            return resp.status, answer

    async def _to_group(self, request: web.Request, name: str, group: dict[str, Any],
                        method: str, path: str, body: Any = None,
                        leader_only: bool = False, timeout: float = FORWARD_TIMEOUT
                        ) -> tuple[int, Any]:
        """One group's answer: its leader's, or (reads) the first node that answers."""
        last_error: Exception | None = None
        for url in self._urls(group, leader_only):
            try:
                return await self._call(request, url, method, path, body, timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                last_error = exc
        what = "leader" if leader_only else "node"
        raise ApiError(503, "SERVICE_UNAVAILABLE",
                       f"no {what} of group {name!r} answered"
                       + (f" ({last_error})" if last_error else ""), {"group": name})

    async def _to_each(self, request: web.Request, method: str, path: str, body: Any = None,
                       leader_only: bool = False, only: str | None = None,
                       timeout: float = FORWARD_TIMEOUT) -> dict[str, tuple[int, Any]]:
        groups = await self._groups()
        if only is not None:
            if only not in groups:
                raise ApiError(404, "UNKNOWN_GROUP", f"broker group {only!r} is not registered",
                               {"group": only})
            groups = {only: groups[only]}
        if not groups:
            raise ApiError(503, "SERVICE_UNAVAILABLE", "no broker group is registered")
        names = sorted(groups)
        answers = await asyncio.gather(
            *(self._to_group(request, n, groups[n], method, path, body, leader_only, timeout)
              for n in names), return_exceptions=True)
        out: dict[str, tuple[int, Any]] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, ApiError):
                out[name] = (answer.status, {"error": {"code": answer.code,
                                                       "message": answer.message,
                                                       "data": answer.data}})
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[name] = answer
        return out

    @staticmethod
    def _all_ok(answers: dict[str, tuple[int, Any]], ok_status: int = 200) -> web.Response:
        """Per-group answers: the first error's status if any failed."""
        errors = {g: d for g, (s, d) in answers.items() if s >= 400}
        body = {"groups": {g: d for g, (_, d) in answers.items()}}
        if errors:
            status = min(s for s, _ in answers.values() if s >= 400)
            first = next(iter(errors.values()))
            err = first.get("error", {}) if isinstance(first, dict) else {}
            body["error"] = {"code": err.get("code", "HTTP_ERROR"),
                             "message": "; ".join(
                                 f"{g}: {(d.get('error') or {}).get('message', d)}"
                                 for g, d in errors.items()),
                             "data": {"groups": list(errors)}}
            return json_response(body, status)
        return json_response(body, ok_status)

    # ------------------------------------------------------------------ topics

    async def topics(self, request: web.Request) -> web.Response:
        answers = await self._to_each(request, "GET", f"{API}/topics")
        topics = []
        unreachable = []
        for group, (status, data) in sorted(answers.items()):
            if status >= 400:
                unreachable.append(group)
                continue
            topics += data.get("topics", [])
        topics.sort(key=lambda t: (t["topic"], t["group"]))
        return json_response({"topics": topics, "unreachable_groups": unreachable})

    async def describe_topic(self, request: web.Request) -> web.Response:
        topic = path_name(request, "topic")
        answers = await self._to_each(request, "GET", f"{API}/topics/{quote(topic)}")
        groups = {g: d for g, (s, d) in answers.items() if s == 200}
        if not groups:
            raise ApiError(404, "UNKNOWN_TOPIC", f"topic {topic!r} does not exist",
                           {"topic": topic})
        return json_response({"topic": topic, "groups": groups,
                              "messages": sum(d.get("messages", 0) for d in groups.values())})

    async def create_topic(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        only = body.pop("group", None)
        if only is not None and not isinstance(only, str):
            raise ApiError(400, "INVALID_REQUEST", "field 'group' must be str")
        field(body, "topic", str)
        answers = await self._to_each(request, "POST", f"{API}/topics", body,
                                      leader_only=True, only=only)
        return self._all_ok(answers, 201)

    async def change_topic(self, request: web.Request) -> web.Response:
        """PUT / DELETE: on every group that has the topic."""
        topic = path_name(request, "topic")
        body = await read_json(request) if request.method == "PUT" else None
        path = f"{API}/topics/{quote(topic)}"
        having = await self._to_each(request, "GET", path)
        groups = [g for g, (s, _) in having.items() if s == 200]
        if not groups:
            raise ApiError(404, "UNKNOWN_TOPIC", f"topic {topic!r} does not exist",
                           {"topic": topic})
        answers: dict[str, tuple[int, Any]] = {}
        for group in groups:
            answers.update(await self._to_each(request, request.method, path, body,
                                               leader_only=True, only=group))
        return self._all_ok(answers)

    # --------------------------------------------------------- consumer groups

    async def consumer_groups(self, request: web.Request) -> web.Response:
        answers = await self._to_each(request, "GET", f"{API}/consumer-groups")
        merged: dict[str, dict[str, Any]] = {}
        for _group, (status, data) in sorted(answers.items()):
            if status >= 400:
                continue
            for cg in data.get("consumer_groups", []):
                m = merged.setdefault(cg["group"], {"group": cg["group"], "topics": [],
                                                    "lag": 0, "members": 0})
                m["topics"] = sorted(set(m["topics"]) | set(cg["topics"]))
                m["lag"] += cg["lag"]
                m["members"] = max(m["members"], cg["members"])
        return json_response({"consumer_groups": [merged[k] for k in sorted(merged)]})

    async def consumer_group(self, request: web.Request) -> web.Response:
        name = path_name(request, "group")
        answers = await self._to_each(request, "GET", f"{API}/consumer-groups/{quote(name)}")
        found = {g: d for g, (s, d) in answers.items() if s == 200}
        if not found:
            raise ApiError(404, "UNKNOWN_GROUP",
                           f"consumer group {name!r} has no committed offsets and no members",
                           {"group": name})
        topics: dict[str, list[dict[str, Any]]] = {}
        members: dict[str, dict[str, Any]] = {}
        for data in found.values():
            for topic, rows in data.get("topics", {}).items():
                topics.setdefault(topic, []).extend(rows)
            for m in data.get("members", []):
                members[m["client_id"]] = m
        return json_response({"group": name, "topics": topics,
                              "members": [members[k] for k in sorted(members)],
                              "lag": sum(q["lag"] for qs in topics.values() for q in qs)})

    async def reset_offsets(self, request: web.Request) -> web.Response:
        name = path_name(request, "group")
        body = await read_json(request)
        topic = checked_name(field(body, "topic", str), "topic")
        field(body, "timestamp_ms" if "offset" not in body else "offset", int)
        having = await self._to_each(request, "GET", f"{API}/topics/{quote(topic)}")
        groups = [g for g, (s, _) in having.items() if s == 200]
        if not groups:
            raise ApiError(404, "UNKNOWN_TOPIC", f"topic {topic!r} does not exist",
                           {"topic": topic})
        answers: dict[str, tuple[int, Any]] = {}
        for group in groups:
            answers.update(await self._to_each(
                request, "POST", f"{API}/consumer-groups/{quote(name)}/reset-offsets", body,
                leader_only=True, only=group))
        return self._all_ok(answers)

    # ---------------------------------------------------------------- messages

    async def message_by_id(self, request: web.Request) -> web.Response:
        msg_id = request.match_info["msg_id"]
        group, _ = message_id(request)
        answers = await self._to_each(request, "GET", f"{API}/messages/{quote(msg_id)}",
                                      only=group)
        status, data = answers[group]
        return json_response(data, status)

    async def messages_by_key(self, request: web.Request) -> web.Response:
        if not request.query.get("topic") or not request.query.get("key"):
            raise ApiError(400, "INVALID_REQUEST", "query parameters 'topic' and 'key' are"
                           " required (look up by id with /api/v1/messages/<msg_id>)")
        checked_name(request.query["topic"], "topic")
        answers = await self._to_each(request, "GET", f"{API}/messages")
        ok = {g: d for g, (s, d) in answers.items() if s == 200}
        if not ok:
            status, data = min(answers.values(), key=lambda a: a[0])
            return json_response(data, status)
        messages = [m for d in ok.values() for m in d.get("messages", [])]
        messages.sort(key=lambda m: m.get("store_timestamp_ms", 0), reverse=True)
        return json_response({"topic": request.query["topic"], "key": request.query["key"],
                              "messages": messages,
                              "scanned": sum(d.get("scanned", 0) for d in ok.values()),
                              "complete": all(d.get("complete") for d in ok.values())})

    # -------------------------------------------------------------- leadership

    async def transfer_leadership(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        group = field(body, "group", str)
        to = field(body, "to", int)
        answers = await self._to_each(request, "POST", f"{API}/leadership/transfer",
                                      {"to": to}, leader_only=True, only=group)
        status, data = answers[group]
        return json_response(data, status)

    # ------------------------------------------------------------- membership

    async def members(self, request: web.Request) -> web.Response:
        """Each group's configuration, as its leader sees it (or ?group=)."""
        only = request.query.get("group") or None
        answers = await self._to_each(request, "GET", f"{API}/members", leader_only=True,
                                      only=only)
        return self._all_ok(answers)

    async def change_members(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        group = field(body, "group", str)
        action = request.match_info["action"]
        forward = {k: v for k, v in body.items() if k != "group"}
        # A catch-up may take the whole timeout the caller allowed.
        timeout = float(forward.get("timeout") or 60.0) + 5.0
        answers = await self._to_each(request, "POST", f"{API}/members/{quote(action)}",
                                      forward, leader_only=True, only=group, timeout=timeout)
        status, data = answers[group]
        return json_response(data, status)

    # ------------------------------------------------------------------- audit

    async def audit(self, request: web.Request) -> web.Response:
        """The nightly audit's latest verdict (namesrv/audit_verdict.py): 404 when
        there is none; a file that cannot be believed is the state `unreadable`."""
        try:
            verdict = read_verdict(self.reports_dir, self.audit_stale_after_s)
        except NoAudit as exc:
            raise ApiError(404, "NO_AUDIT", str(exc)) from None
        return json_response(verdict.to_json())

    # --------------------------------------------------------------- retention

    async def _node_retention(self, request: web.Request, node: dict[str, Any]
                              ) -> dict[str, Any]:
        """One node's GET /retention (each replica has its own disk and files)."""
        row = {"node_id": node["node_id"], "address": node["address"]}
        if not node.get("reachable") or not node.get("admin_url"):
            return {**row, "error": {"code": "UNREACHABLE",
                                     "message": "no status or no admin app"}}
        try:
            status, data = await self._call(request, node["admin_url"], "GET",
                                            f"{API}/retention")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return {**row, "error": {"code": "UNREACHABLE", "message": str(exc)}}
        if status >= 400 or not isinstance(data, dict):
            return {**(data if isinstance(data, dict) else {}), **row}
        return {**data, **row}

    async def retention(self, request: web.Request) -> web.Response:
        """Every node of every group (or of ?group=): retention is per replica."""
        only = request.query.get("group")
        groups = await self._groups()
        if only is not None:
            checked_name(only, "group")
            if only not in groups:
                raise ApiError(404, "UNKNOWN_GROUP", f"broker group {only!r} is not registered",
                               {"group": only})
            groups = {only: groups[only]}
        out: dict[str, Any] = {}
        for name, group in sorted(groups.items()):
            nodes = await asyncio.gather(*(self._node_retention(request, n)
                                           for n in group["nodes"]))
            out[name] = {"leader": group.get("leader"), "nodes": list(nodes)}
        return json_response({"groups": out})

    async def retention_trim(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        group = body.pop("group", None)
        if group is None:
            names = sorted(await self._groups())
            if len(names) != 1:
                raise ApiError(400, "INVALID_REQUEST",
                               "say which broker group with 'group' (registered: "
                               f"{', '.join(names) or 'none'})")
            group = names[0]
        if not isinstance(group, str):
            raise ApiError(400, "INVALID_REQUEST", "field 'group' must be str")
        checked_name(group, "group")
        answers = await self._to_each(request, "POST", f"{API}/retention/trim", body,
                                      leader_only=True, only=group)
        status, data = answers[group]
        return json_response(data, status)
