"""The broker's HTTP admin app (aiohttp), on the broker's own event loop.

Serves, for this node and its group: `/metrics` (broker/metrics.py), the JSON
admin API under `/api/v1` (described by `/openapi.json`, reference in
docs/operations.md), the dashboard at `/` and the reports directory.

Reads are answered from this node's state, which holds committed data only,
so any node answers them. Writes (topics, offset resets, leadership transfer)
go through the Raft log and so need the ready leader: elsewhere they get 409
NOT_LEADER with the leader's client and admin addresses. The NameServer's
admin app (namesrv/admin_http.py) forwards writes to the right leader, which
is what the CLI and the dashboard use.

With a cluster secret, every API request must be signed by a key of the
broker's KeyStore and writes need an administrator (or the NameServer's app,
signing as a cluster member); see webadmin/app.py `AdminAuth` and
docs/security.md, "The admin HTTP API". With `tls_cert_file` the app serves HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from functools import partial
from typing import Any

from aiohttp import web

from commitlog.message import StoredMessage, valid_topic
from consumequeue import Unit
from ledgermq.base.address import split_host_port
from ledgermq.base.clock import monotonic_ms
from ledgermq.base.errors import LedgerMQError, NotLeaderError
from ledgermq.broker import reconfigure
from ledgermq.broker.acl import Action
from ledgermq.broker.codec import message_view
from ledgermq.broker.control import MAX_QUEUES, PERM_RW, offsets_reset, topic_delete, topic_put
from ledgermq.broker.metrics import Instruments, broker_registry
from ledgermq.broker.queue_repair import DamagedUnitError, QueueKey, check_read, read_message_run
from ledgermq.broker.view import BrokerView
from ledgermq.webadmin.app import (
    PRINCIPAL,
    AdminAuth,
    ApiError,
    add_common_routes,
    add_operations,
    auth_failures,
    check_app_exposure,
    field,
    group_view,
    int_param,
    json_response,
    make_app,
    message_id,
    node_row,
    path_name,
    read_json,
    start_site,
    tls_context,
    wire_status,
)
from ledgermq.webadmin.openapi import openapi_document

log = logging.getLogger(__name__)

# Lookup by key scans the newest messages of the topic's queues: at most this
# many messages and this much time per request (documented in operations.md).
KEY_SCAN_MAX = 20_000
KEY_SCAN_SECONDS = 2.0
_SCAN_CHUNK = 256


MEMBER_ACTIONS = ("add", "promote", "remove", "replace", "rejoin")


def _node_id_field(body: dict[str, Any], key: str) -> int:
    value = field(body, key, int)
    if not 0 < value < 2**63:
        raise ApiError(400, "INVALID_REQUEST", f"field {key!r} must be in [1, 2^63)")
    return int(value)


def _address_field(body: dict[str, Any], key: str = "address") -> str:
    """A new node's HOST:PORT, checked here so a typo is a 400, not a dead peer;
    `client_address` is optional (empty)."""
    address = field(body, key, str, "" if key == "client_address" else ...)
    if not address and key == "client_address":
        return ""
    try:
        split_host_port(address)
    except ValueError as exc:
        raise ApiError(400, "INVALID_REQUEST", f"field {key!r}: {exc}") from None
    if len(address) > 255:
        raise ApiError(400, "INVALID_REQUEST", f"field {key!r} is too long")
    return address


def body_view(body: bytes) -> dict[str, Any]:
    """A message body for JSON: text when it is UTF-8, base64 always."""
    out: dict[str, Any] = {"body_base64": base64.b64encode(body).decode(), "body_size": len(body)}
    try:
        out["body_text"] = body.decode()
    except UnicodeDecodeError:
        out["body_text"] = None
    return out


class BrokerAdmin:
    """The admin app of one broker: `await start()`, later `await close()`."""

    def __init__(self, broker: BrokerView, instruments: Instruments) -> None:
        self.b = broker
        self.instruments = instruments
        self.registry = broker_registry(broker, instruments)
        self.runner: web.AppRunner | None = None
        self.url: str | None = None
        cfg = broker.config
        self.auth = AdminAuth(keys=broker.keystore, token=cfg.admin_token,
                              metrics_auth=cfg.metrics_auth)
        self.app = make_app(self.auth, auth_failures(self.registry))
        add_common_routes(self.app, registry=self.registry, openapi=openapi_document("broker"),
                          reports_dir=cfg.reports_dir, kind="broker")
        add_operations(self.app, "broker", {
            "status": self.status, "cluster": self.cluster, "topics": self.topics,
            "create_topic": self.create_topic, "describe_topic": self.describe_topic,
            "update_topic": self.update_topic, "delete_topic": self.delete_topic,
            "consumer_groups": self.consumer_groups, "consumer_group": self.consumer_group,
            "reset_offsets": self.reset_offsets, "messages_by_key": self.messages_by_key,
            "message_by_id": self.message_by_id, "transfer_leadership": self.transfer_leadership,
            "retention": self.retention, "retention_trim": self.retention_trim,
            "members": self.members, "change_members": self.change_members,
        })

    async def start(self) -> str:
        cfg = self.b.config
        host, port = split_host_port(cfg.admin_listen)
        check_app_exposure(f"broker {cfg.group}/n{cfg.node_id} admin app", host, self.auth,
                       cfg.allow_open)
        # Listening on every interface, it is reached where its clients reach
        # it: the host of the client address it gives out.
        self.runner, self.url = await start_site(
            self.app, host, port, tls_context(cfg.tls_cert_file, cfg.tls_key_file),
            advertise_host=split_host_port(self.b.advertised)[0])
        return self.url

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # ---------------------------------------------------------------- helpers

    async def _require_leader(self) -> None:
        try:
            self.b.require_writable()
        except NotLeaderError as exc:
            raise ApiError(409, "NOT_LEADER", exc.message, {
                "leader": exc.leader,
                "leader_admin_url": await self._leader_admin_url()}) from None

    async def _leader_admin_url(self) -> str | None:
        """The leader's admin URL, asked of the leader itself (only on this error path)."""
        address = self.b.leader_client_address()
        status = await self._peer_status(address, 0.5) if address else None
        return status.get("admin_url") if status else None

    async def _peer_status(self, address: str, timeout: float) -> dict[str, Any] | None:
        """Another node's BROKER_STATUS, asked as a cluster member (the cluster
        key, the cluster CA) as the NameServer asks: a secured node refuses an
        open request, and would look unreachable."""
        return await wire_status(address, timeout, credentials=self.b.security.cluster,
                                 tls=self.b.security.namesrv_tls)

    async def _submit(self, op: dict[str, Any]) -> None:
        assert self.b.controls is not None
        await self._require_leader()
        await self.b.controls.submit(op, 64)

    def _may_read_messages(self, request: web.Request, topic: str) -> None:
        """Message bodies over HTTP follow the wire's rule: SUB on the topic
        (administrators and cluster members: always), so the admin API is no
        way around a user's grants. Metadata reads need only a signature."""
        if not self.b.config.cluster_secret_file:
            return  # authentication off: the broker runs open
        try:
            self.b.state.acl.authorize(request.get(PRINCIPAL), request.remote or "",
                                       Action.SUB, topic)
        except LedgerMQError as exc:
            raise ApiError(403, "NO_PERMISSION", str(exc), {"topic": topic}) from None

    def _topic(self, topic: str) -> Any:
        config = self.b.state.topics.get(topic)
        if config is None:
            raise ApiError(404, "UNKNOWN_TOPIC", f"topic {topic!r} does not exist",
                           {"topic": topic})
        return config

    def _topic_view(self, topic: str) -> dict[str, Any]:
        config = self._topic(topic)
        cq = self.b.cq
        assert cq is not None
        queues = []
        for q in range(config.queues):
            lo, hi = cq.offsets(topic, q)
            queues.append({"queue_id": q, "min_offset": lo, "max_offset": hi})
        return {"topic": topic, "group": self.b.config.group, "queues": config.queues,
                "perm": config.perm, "messages": sum(x["max_offset"] - x["min_offset"]
                                                     for x in queues),
                "queue_offsets": queues}

    # ------------------------------------------------------------------ status

    async def status(self, request: web.Request) -> web.Response:
        info = self.b.status()
        info["node_status"] = {}
        try:
            info["node_status"] = self.b.node.status().to_json()
        except Exception as exc:  # a stopping node: report what it says
            info["node_status"] = {"error": repr(exc)}
        return json_response(info)

    async def cluster(self, request: web.Request) -> web.Response:
        """This group as its nodes report themselves (peers over the wire)."""
        cfg = self.b.config
        own = self.b.status()
        rows: list[dict[str, Any]] = []
        others = [(nid, p.client) for nid, p in sorted(cfg.peers.items()) if nid != cfg.node_id]
        statuses = await asyncio.gather(*(self._peer_status(addr, 0.8) for _, addr in others))
        by_id: dict[int, tuple[str, dict[str, Any] | None]] = {
            cfg.node_id: (self.b.advertised, own)}
        by_id.update({nid: (addr, st) for (nid, addr), st in zip(others, statuses, strict=True)})
        for nid in sorted(by_id):
            address, st = by_id[nid]
            rows.append(node_row(f"n{nid}", address, st))
        return json_response({"source": f"broker {cfg.group}/n{cfg.node_id}",
                              "groups": {cfg.group: {"cluster": cfg.cluster,
                                                     **group_view(rows)}}})

    # ------------------------------------------------------------------ topics

    async def topics(self, request: web.Request) -> web.Response:
        return json_response({"topics": [self._topic_view(t)
                                         for t in sorted(self.b.state.topics)]})

    async def describe_topic(self, request: web.Request) -> web.Response:
        return json_response(self._topic_view(path_name(request, "topic")))

    def _topic_fields(self, body: dict[str, Any], queues_default: Any, perm_default: Any
                      ) -> tuple[int, int]:
        queues = field(body, "queues", int, queues_default)
        perm = field(body, "perm", int, perm_default)
        if not 1 <= queues <= MAX_QUEUES:
            raise ApiError(400, "INVALID_REQUEST", f"queues must be in [1, {MAX_QUEUES}]")
        if perm & ~PERM_RW or perm < 0:
            raise ApiError(400, "INVALID_REQUEST", "perm must be a subset of 6 (4 read, 2 write)")
        return queues, perm

    async def create_topic(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        topic = field(body, "topic", str)
        if not valid_topic(topic):
            raise ApiError(400, "INVALID_REQUEST",
                           f"invalid topic name {topic!r}: 1-127 characters of [A-Za-z0-9_%|-]")
        queues, perm = self._topic_fields(body, self.b.config.default_queues, PERM_RW)
        await self._submit(topic_put(topic, queues, perm))
        return json_response(self._topic_view(topic), 201)

    async def update_topic(self, request: web.Request) -> web.Response:
        topic = path_name(request, "topic")
        body = await read_json(request)
        current = self._topic(topic)
        queues, perm = self._topic_fields(body, current.queues, current.perm)
        if queues < current.queues:
            raise ApiError(400, "INVALID_REQUEST",
                           f"queues cannot shrink ({current.queues} -> {queues}): messages in"
                           " the dropped queues would become unreachable")
        await self._submit(topic_put(topic, queues, perm))
        return json_response(self._topic_view(topic))

    async def delete_topic(self, request: web.Request) -> web.Response:
        topic = path_name(request, "topic")
        self._topic(topic)
        await self._submit(topic_delete(topic))
        return json_response({"topic": topic, "deleted": topic not in self.b.state.topics})

    # --------------------------------------------------------- consumer groups

    def _group_rows(self, group: str | None = None) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """{group: {topic: [queue rows]}} from the committed offsets."""
        cq = self.b.cq
        assert cq is not None
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for (g, topic, queue_id), offset in sorted(self.b.state.offsets.items()):
            if group is not None and g != group:
                continue
            lo, hi = cq.offsets(topic, queue_id)
            out.setdefault(g, {}).setdefault(topic, []).append({
                "queue_id": queue_id, "broker_group": self.b.config.group, "offset": offset,
                "min_offset": lo, "max_offset": hi, "lag": max(0, hi - offset)})
        return out

    def _members(self) -> dict[str, Any]:
        return self.b.members.describe(monotonic_ms())

    async def consumer_groups(self, request: web.Request) -> web.Response:
        rows = self._group_rows()
        members = self._members()
        groups = []
        for name in sorted(set(rows) | set(members)):
            topics = rows.get(name, {})
            groups.append({"group": name, "topics": sorted(topics),
                           "lag": sum(q["lag"] for qs in topics.values() for q in qs),
                           "members": len(members.get(name, []))})
        return json_response({"consumer_groups": groups})

    async def consumer_group(self, request: web.Request) -> web.Response:
        name = path_name(request, "group")
        rows = self._group_rows(name).get(name)
        members = self._members().get(name, [])
        if rows is None and not members:
            raise ApiError(404, "UNKNOWN_GROUP",
                           f"consumer group {name!r} has no committed offsets and no members",
                           {"group": name})
        rows = rows or {}
        return json_response({"group": name, "members": members, "topics": rows,
                              "lag": sum(q["lag"] for qs in rows.values() for q in qs)})

    async def reset_offsets(self, request: web.Request) -> web.Response:
        """Move a group's offsets of a topic to the first message stored at or
        after `timestamp_ms` (RocketMQ resetOffsetByTime), or to `offset`
        (clamped to each queue's range), of every queue or of `queue_id` only,
        through the log. `dry_run`: answer the same, change nothing."""
        name = path_name(request, "group")
        body = await read_json(request)
        topic = field(body, "topic", str)
        by_time = "offset" not in body
        target = field(body, "timestamp_ms" if by_time else "offset", int)
        only = body.get("queue_id")
        if only is not None:
            only = field(body, "queue_id", int)
        dry_run = field(body, "dry_run", bool, False)
        config = self._topic(topic)
        if only is not None and not 0 <= only < config.queues:
            raise ApiError(400, "INVALID_REQUEST",
                           f"topic {topic!r} has queues 0..{config.queues - 1}, not {only}")
        await self._require_leader()
        cq = self.b.cq
        assert cq is not None
        items, answer = [], []
        for q in range(config.queues) if only is None else (only,):
            lo, hi = cq.offsets(topic, q)
            wanted = cq.offset_for_timestamp(topic, q, target) if by_time else target
            offset = min(max(wanted, lo), hi)
            items.append((name, topic, q, offset))
            answer.append({"queue_id": q, "offset": offset,
                           "previous": self.b.state.offsets.get((name, topic, q))})
        if not dry_run:
            await self._submit(offsets_reset(items))
        return json_response({"group": name, "topic": topic, "dry_run": dry_run,
                              **({"timestamp_ms": target} if by_time else {"offset": target}),
                              "offsets": answer})

    # ---------------------------------------------------------------- messages

    def _view(self, stored: Any, queue_offset: int | None) -> dict[str, Any]:
        view = message_view(self.b.config.group, stored, queue_offset if queue_offset is not None
                            else -1)
        view["queue_offset"] = queue_offset
        body = view.pop("body")
        view.update(body_view(body))
        return view

    async def message_by_id(self, request: web.Request) -> web.Response:
        """An offset message id `<group>@<16 hex physical offset>`: the record is
        read at that offset, and served only when a ConsumeQueue unit points at
        it (so only committed messages, and never bytes that are not a record)."""
        msg_id = request.match_info["msg_id"]
        group, offset = message_id(request)
        if group != self.b.config.group:
            raise ApiError(404, "NOT_FOUND",
                           f"message id {msg_id!r} belongs to group {group!r}, not"
                           f" {self.b.config.group!r}", {"group": group})
        found = self._read_at(offset)
        if found is None:
            raise ApiError(404, "NOT_FOUND", f"no committed message with id {msg_id!r}")
        stored, queue_offset = found
        self._may_read_messages(request, stored.message.topic)
        return json_response(self._view(stored, queue_offset))

    def _read_at(self, offset: int) -> tuple[Any, int] | None:
        log_ = self.b.node.log
        cq = self.b.cq
        assert cq is not None
        head = log_.read_bytes(offset, 8)
        if len(head) < 8:
            return None
        size = int.from_bytes(head[:4], "little")  # a record starts with its size (u32 LE)
        if not 0 < size <= self.b.config.message_size_bytes_max:
            return None
        try:
            stored = log_.read_message(offset, size)
        except Exception:  # not a record boundary, or damaged: not a message id we gave
            return None
        m = stored.message
        queue = cq.get(m.topic, m.queue_id)
        if queue is None:
            return None
        slot = queue.first_offset_at_or_after(offset)
        if slot >= queue.max_offset:
            return None
        unit = queue.read(slot, 1)
        if not unit or unit[0].physical_offset != offset:
            return None
        return stored, slot

    async def messages_by_key(self, request: web.Request) -> web.Response:
        """Messages of `topic` whose keys contain `key`, newest first: a scan of at
        most KEY_SCAN_MAX newest messages and KEY_SCAN_SECONDS (the answer says
        whether it stopped early)."""
        topic = request.query.get("topic")
        key = request.query.get("key")
        if not topic or not key:
            raise ApiError(400, "INVALID_REQUEST", "query parameters 'topic' and 'key' are"
                           " required (look up by id with /api/v1/messages/<msg_id>)")
        limit = int_param(request, "limit", 32, 1, 1000)
        scan_max = int_param(request, "scan_max", KEY_SCAN_MAX, 1, 1_000_000)
        self._may_read_messages(request, topic)
        config = self._topic(topic)
        cq = self.b.cq
        assert cq is not None
        deadline = time.monotonic() + KEY_SCAN_SECONDS
        cursors = {}
        for q in range(config.queues):
            lo, hi = cq.offsets(topic, q)
            cursors[q] = (lo, hi)
        found: list[dict[str, Any]] = []
        scanned = 0
        complete = True
        while cursors and len(found) < limit:
            if scanned >= scan_max or time.monotonic() > deadline:
                complete = False
                break
            for q in list(cursors):
                lo, hi = cursors[q]
                if hi <= lo:
                    del cursors[q]
                    continue
                start = max(lo, hi - _SCAN_CHUNK)
                units, records = await self._read_checked((topic, q), start, hi - start)
                for unit, stored in zip(reversed(units), reversed(records), strict=True):
                    scanned += 1
                    if key in stored.message.keys.split():
                        found.append(self._view(stored, unit.queue_offset))
                cursors[q] = (lo, start)
                await asyncio.sleep(0)  # a long scan must not starve the Raft loop
        found.sort(key=lambda m: m["store_timestamp_ms"], reverse=True)
        return json_response({"topic": topic, "key": key, "messages": found[:limit],
                              "scanned": scanned, "complete": complete and len(found) < limit,
                              "group": self.b.config.group})

    async def _read_checked(self, key: QueueKey, offset: int, count: int
                            ) -> tuple[list[Unit], list[StoredMessage]]:
        """Up to `count` units of queue `key` from `offset` and their records,
        each checked against its unit as a pull checks them: a damaged unit
        has the queue rebuilt from the log (queue_repair.py) and is read
        again; never another queue's record."""
        cq = self.b.cq
        assert cq is not None
        read = partial(read_message_run, self.b.node.log)

        def units_and_records() -> tuple[list[Unit], list[StoredMessage]]:
            units = cq.read(*key, offset, count)
            return units, check_read(key, units, read, self.b.entry_limit)

        try:
            return units_and_records()
        except DamagedUnitError as damage:
            await self.b.queue_repairs.repair(cq, damage)
        try:
            return units_and_records()
        except DamagedUnitError as again:
            raise ApiError(503, "SERVICE_UNAVAILABLE",
                           f"{again}, again after a rebuild from the log") from None

    # --------------------------------------------------------------- retention

    def _retention(self) -> Any:
        retention = self.b.retention
        if retention is None:
            raise ApiError(503, "SERVICE_UNAVAILABLE", "the broker is not started")
        return retention

    async def retention(self, request: web.Request) -> web.Response:
        return json_response(await self._retention().describe())

    async def retention_trim(self, request: web.Request) -> web.Response:
        """An operator's "delete up to" (broker/retention.py `manual_trim`)."""
        body = await read_json(request)
        index = field(body, "index", int) if "index" in body else None
        position = field(body, "position", int) if "position" in body else None
        dry_run = field(body, "dry_run", bool, False)
        if (index is None) == (position is None):
            raise ApiError(400, "INVALID_REQUEST", "give exactly one of 'index' and 'position'")
        if (index if index is not None else position or 0) < 0:
            raise ApiError(400, "INVALID_REQUEST", "'index' and 'position' must not be negative")
        await self._require_leader()
        answer = await self._retention().manual_trim(index=index, position=position,
                                                     dry_run=dry_run)
        return json_response({"group": self.b.config.group, **answer})

    # -------------------------------------------------------------- leadership

    # ------------------------------------------------------------- membership

    async def members(self, request: web.Request) -> web.Response:
        return json_response(reconfigure.members_view(self.b.node))

    async def change_members(self, request: web.Request) -> web.Response:
        """One operator operation (add/promote/remove/replace/rejoin) on the leader."""
        action = request.match_info["action"]
        if action not in MEMBER_ACTIONS:
            raise ApiError(400, "INVALID_REQUEST", f"unknown action {action!r}; one of "
                           f"{', '.join(MEMBER_ACTIONS)}")
        body = await read_json(request)
        node_id = _node_id_field(body, "node_id")
        directory_id = field(body, "directory_id", int, 0)
        if not 0 <= directory_id < 2**63:
            raise ApiError(400, "INVALID_REQUEST", "field 'directory_id' must be in [0, 2^63)")
        learner = field(body, "learner", bool, False)
        timeout = body.get("timeout", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
                or not 0.1 <= timeout <= 600:
            raise ApiError(400, "INVALID_REQUEST", "field 'timeout' must be in [0.1, 600]")
        if self.b.node.role != "leader":
            await self._require_leader()
        node = self.b.node
        try:
            if action == "add":
                steps = await reconfigure.add(node, node_id, _address_field(body), directory_id,
                                          client_address=_address_field(body, "client_address"),
                                          learner=learner, timeout=float(timeout))
            elif action == "promote":
                steps = await reconfigure.promote_learner(node, node_id, float(timeout))
            elif action == "remove":
                steps = await reconfigure.remove_member(
                    node, node_id, force=field(body, "force", bool, False), timeout=float(timeout))
            elif action == "replace":
                steps = await reconfigure.replace(
                    node, node_id, _node_id_field(body, "new_node_id"), _address_field(body),
                    directory_id, client_address=_address_field(body, "client_address"),
                    timeout=float(timeout))
            else:
                steps = await reconfigure.rejoin_member(node, node_id, directory_id,
                                                        learner=learner,
                                                        timeout=float(timeout))
        except reconfigure.LeadershipMoved as exc:
            raise ApiError(409, "LEADERSHIP_MOVED", str(exc),
                           {"leader": exc.leader_id, "retry": True}) from None
        except reconfigure.OutcomeUnknown as exc:
            raise ApiError(503, "OUTCOME_UNKNOWN", str(exc),
                           {"index": exc.index, "retry": True}) from None
        except reconfigure.ReconfigureError as exc:
            raise ApiError(exc.status, "MEMBERSHIP_REFUSED", str(exc)) from None
        except NotLeaderError as exc:
            raise ApiError(409, "NOT_LEADER", exc.message, {"leader": exc.leader}) from None
        view = reconfigure.members_view(node)
        return json_response({"group": self.b.config.group, "action": action,
                              "steps": [s.to_json() for s in steps], **view})

    async def transfer_leadership(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        to = field(body, "to", int)
        cfg = self.b.config
        voters = self.b.node.membership.voter_ids
        if to not in voters:
            raise ApiError(400, "INVALID_REQUEST",
                           f"node {to} is not a voter of group {cfg.group} (voters "
                           f"{sorted(voters)})")
        if self.b.node.role != "leader":
            await self._require_leader()
        timeout = min(max(cfg.tick_ms * cfg.election_timeout_ticks * 4 / 1000, 1.0), 10.0)
        try:
            done = await self.b.node.transfer_leadership(to, timeout)
        except LedgerMQError:
            raise
        except Exception as exc:
            raise ApiError(503, "SERVICE_UNAVAILABLE", f"transfer failed: {exc}") from None
        if not done:
            raise ApiError(503, "TRANSFER_FAILED",
                           f"node {to} did not take over within {timeout:g}s",
                           {"leader_id": self.b.node.leader_id})
        return json_response({"group": cfg.group, "leader_id": self.b.node.leader_id,
                              "transferred": True})
