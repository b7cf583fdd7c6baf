"""Client request handlers of a broker node (request codes 200-399).

Each handler validates its body (INVALID_REQUEST names the field), checks
that the connection's principal may make it (the ACL, broker/acl.py, on a
broker with a cluster secret; an open broker checks nothing), checks where the
request may run (writes: the ready leader; reads: any node, which serves
committed data only) and answers with the map docs/protocol.md gives.
SEND_MESSAGES, the hot path with its idempotency bookkeeping, is in
send_handler.py; the checks all handlers share are in request_checks.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from commitlog import tag_hash
from commitlog.message import valid_group, valid_topic
from consumequeue import Unit
from ledgermq.base.clock import monotonic_ms
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    NoPermissionError,
    OffsetMovedError,
    OffsetOutOfRangeError,
    ServiceUnavailableError,
)
from ledgermq.broker.acl import (
    ANY_NAME,
    AclError,
    Action,
    User,
    parse_grants,
    perm_name,
    valid_access_key,
)
from ledgermq.broker.codec import (
    client_id_field,
    commit_offsets_body,
    group_field,
    message_view,
    offset_field,
    queue_id_field,
    subscriptions_field,
    topic_field,
)
from ledgermq.broker.control import (
    MAX_QUEUES,
    PERM_READ,
    PERM_RW,
    acl_grant,
    acl_revoke,
    acl_user_delete,
    acl_user_put,
    topic_delete,
    topic_put,
)
from ledgermq.broker.queue_repair import DamagedUnitError, check_read, read_message_run
from ledgermq.broker.request_checks import Body, RequestChecks, body_field, body_map, nonneg_field
from ledgermq.broker.send_handler import SendHandler
from ledgermq.broker.view import BrokerView
from ledgermq.wire import Connection, Handler

PULL_BYTES_MAX = 4 << 20
FILTER_SCAN_MAX = 2048


def _check_joinable(groups: Mapping[str, object]) -> None:
    """A grant on a group no consumer can join is refused here, where an
    administrator asks for it. The state machine's own rule (`acl.valid_group`)
    also takes '.', and stays as it is: entries and snapshots written under
    it must replay to the same users."""
    for name in groups:
        if name != ANY_NAME and not valid_group(name):
            raise InvalidRequestError(
                f"group {name[:300]!r}: no consumer can join a group of that name"
                " (1-255 characters of [A-Za-z0-9_%|-])", data={"group": name[:300]})


class Handlers(RequestChecks):
    """Every client request but SEND_MESSAGES (send_handler.py)."""

    async def create_topic(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = body_map(body)
        topic = body_field(body, "topic", str)
        if not valid_topic(topic):
            raise InvalidRequestError(f"invalid topic name {topic!r}")
        queues = body_field(body, "queues", int, self.b.config.default_queues)
        perm = body_field(body, "perm", int, PERM_RW)
        if not 1 <= queues <= MAX_QUEUES:
            raise InvalidRequestError(f"queues must be in [1, {MAX_QUEUES}]")
        if perm & ~PERM_RW:
            raise InvalidRequestError("perm must be a subset of 6 (4 read, 2 write)")
        self.b.require_writable()
        await self._propose_control(topic_put(topic, queues, perm))
        return {"topic": topic, **self._topic(topic).to_wire()}

    async def delete_topic(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        topic = topic_field(body_map(body))
        self._topic(topic)
        self.b.require_writable()
        await self._propose_control(topic_delete(topic))
        return {"deleted": topic not in self.b.state.topics}

    async def get_topics(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ANY)
        topics = self.b.state.topics
        out: Body = {}
        for name, config in sorted(topics.items()):
            view: Body = dict(config.to_wire())
            view["offsets"] = [list(self.b.cq.offsets(name, q)) for q in range(config.queues)]
            out[name] = view
        return {"topics": out}

    # --------------------------------------------------------------- pull

    async def pull(self, body: Any, conn: Connection) -> Any:
        body = body_map(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        offset = offset_field(body, "offset")
        limit = self.b.config.pull_max_messages
        max_count = min(nonneg_field(body, "max_messages", 32), limit) or 1
        wait_ms = min(nonneg_field(body, "wait_ms", 0), self.b.config.long_poll_timeout_ms)
        tags = body.get("tags")
        if tags is not None and not (isinstance(tags, list)
                                     and all(isinstance(t, str) for t in tags)):
            raise InvalidRequestError("field 'tags' must be a list of strings or nil")
        self._allow_pull(conn, body, topic)
        config = self._topic(topic)
        if not config.perm & PERM_READ:
            raise NoPermissionError(f"topic {topic!r} is not readable (perm {config.perm})",
                                    data={"topic": topic, "perm": config.perm})
        if queue_id >= config.queues:
            raise InvalidRequestError(
                f"queue {queue_id} does not exist: topic {topic!r} has {config.queues} queues")
        cq = self.b.cq
        lo, hi = cq.offsets(topic, queue_id)
        # Only a leader serving writes knows the queue's true end. A follower
        # (or a leader not ready yet) may just be behind after a failover: it
        # must not make a consumer rewind to its own end (a redelivery storm)
        # or skip ahead, so it answers "nothing yet" at the consumer's offset.
        authoritative = self.b.node.leader_ready
        if offset < lo:
            # Retention deleted it (or the topic was re-created): say where the
            # queue starts now, so the consumer can continue there.
            raise OffsetMovedError(
                f"offset {offset} of queue {topic}/{queue_id} is no longer stored (retention);"
                f" the oldest retained message is at offset {lo}",
                data={"min_offset": lo, "max_offset": hi, "requested": offset})
        if offset > hi and authoritative:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside queue {topic}/{queue_id}'s range [{lo}, {hi}]",
                data={"min_offset": lo, "max_offset": hi})
        if offset >= hi and wait_ms:
            await self.b.longpoll.wait((topic, queue_id), wait_ms / 1000)
            lo, hi = cq.offsets(topic, queue_id)
        if offset > hi:
            return {"messages": [], "next_offset": offset, "min_offset": lo,
                    "max_offset": hi}
        key = (topic, queue_id)
        wanted = set(tags) if tags and "*" not in tags else None
        try:
            messages, next_offset = self._read_queue(key, max(offset, lo), max_count, wanted)
        except DamagedUnitError as damage:
            # Rebuilt from the log, the queue is read again from the start.
            await self.b.queue_repairs.repair(cq, damage)
            try:
                messages, next_offset = self._read_queue(key, max(offset, lo), max_count, wanted)
            except DamagedUnitError as again:
                raise ServiceUnavailableError(
                    f"{again}, again after a rebuild from the log; retry, or restart the node"
                ) from None
        return {"messages": messages, "next_offset": next_offset, "min_offset": lo,
                "max_offset": hi}

    def _read_queue(self, key: tuple[str, int], offset: int, max_count: int,
                    wanted: set[str] | None) -> tuple[list[Body], int]:
        """Up to `max_count` messages of queue `key` from `offset` (tags in
        `wanted`, if given), each checked against its unit (queue_repair.py),
        and the offset to read from next."""
        cq = self.b.cq
        scan = max_count if wanted is None else FILTER_SCAN_MAX
        units = cq.read(*key, offset, scan)
        next_offset = offset
        messages = []
        if wanted is not None:
            hashes = {tag_hash(t) for t in wanted}
            candidates = [u for u in units if u.tag_hash in hashes]
        else:
            candidates = units
        truncated = len(candidates) > max_count
        take: list[Unit] = []
        size = 0
        for unit in candidates[:max_count]:
            # Cap the answer's size before reading anything.
            if take and size + unit.size > PULL_BYTES_MAX:
                truncated = True
                break
            take.append(unit)
            size += unit.size
        group = self.b.config.group
        stored = check_read(key, take, partial(read_message_run, self.b.node.log),
                            self.b.entry_limit) if take else []
        for unit, sm in zip(take, stored, strict=True):
            # The tag hash narrowed the candidates; the text decides (hashes collide).
            if wanted is None or sm.message.tags in wanted:
                messages.append(message_view(group, sm, unit.queue_offset))
            next_offset = unit.queue_offset + 1
        if wanted is not None and units and not truncated:
            # Every scanned unit was looked at: skip past the ones filtered out.
            next_offset = max(next_offset, units[-1].queue_offset + 1)
        return messages, next_offset

    async def queue_offsets(self, body: Any, conn: Connection) -> Any:
        body = body_map(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        self._allow_pull(conn, body, topic)
        self._queue(topic, queue_id)
        lo, hi = self.b.cq.offsets(topic, queue_id)
        return {"min_offset": lo, "max_offset": hi}

    # ------------------------------------------------------------- offsets

    async def commit_offsets(self, body: Any, conn: Connection) -> Any:
        group, offsets = commit_offsets_body(body)
        items = []
        self._allow(conn, Action.SUB, group=group)
        for topic in sorted({topic for topic, _, _ in offsets}):
            self._allow(conn, Action.SUB, topic)
        for topic, queue_id, offset in offsets:
            self._queue(topic, queue_id)
            lo, hi = self.b.cq.offsets(topic, queue_id)
            if offset > hi:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is beyond the end of {topic}/{queue_id} ({hi})",
                    data={"min_offset": lo, "max_offset": hi})
            items.append((group, topic, queue_id, offset))
        self.b.require_writable()
        if items:
            await self._propose_control({"op": "offsets.commit",
                                         "offsets": [list(i) for i in items]})
        return {}

    async def query_offset(self, body: Any, conn: Connection) -> Any:
        body = body_map(body)
        group = group_field(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        self._allow(conn, Action.SUB, topic, group)
        return {"offset": self.b.state.offset_of(group, topic, queue_id)}

    # ----------------------------------------------------------- membership

    async def heartbeat(self, body: Any, conn: Connection) -> Any:
        body = body_map(body)
        group = group_field(body)
        client_id = client_id_field(body)
        self._allow(conn, Action.SUB, group=group)
        if body.get("leave"):
            return {"left": self.b.members.leave(group, client_id)}
        subs = subscriptions_field(body)
        mode = body.get("mode", "clustering")
        self.b.members.heartbeat(group, client_id, subs, str(mode), monotonic_ms())
        return {}

    async def members(self, body: Any, conn: Connection) -> Any:
        group = group_field(body_map(body))
        self._allow(conn, Action.SUB, group=group)
        return {"members": self.b.members.members(group, monotonic_ms())}

    async def status(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ANY)
        info = self.b.status()
        info["groups"] = self.b.members.describe(monotonic_ms())
        return info

    # ---------------------------------------------------- ACL administration

    def _acl_user(self, body: Body) -> str:
        key = body_field(body, "access_key", str)
        if not valid_access_key(key):
            raise InvalidRequestError(f"invalid access key {key!r}")
        return key

    def _public_user(self, key: str) -> Body:
        user = self.b.state.acl.users.get(key)
        if user is None:
            # Deleted by a concurrent request between the check and the apply.
            raise InvalidRequestError(f"no ACL user {key!r}", data={"access_key": key})
        return user.to_public()

    def _known_user(self, key: str) -> User:
        user = self.b.state.acl.users.get(key)
        if user is None:
            raise InvalidRequestError(f"no ACL user {key!r}", data={"access_key": key})
        return user

    async def acl_put_user(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = body_map(body)
        key = self._acl_user(body)
        if key == self.b.config.admin_access_key:
            raise InvalidRequestError(
                f"{key!r} is the bootstrap administrator's access key (admin_access_key);"
                " it cannot be an ACL user")
        known = self.b.state.acl.users.get(key)
        if "secret" not in body and known is None:
            raise InvalidRequestError(f"a new user needs a secret ({key!r} does not exist)")
        record = {k: body[k] for k in ("access_key", "secret", "admin", "allow", "topics",
                                       "groups") if k in body}
        try:
            user = User.from_record(record, secret=known.secret if known else None)
        except AclError as exc:
            raise InvalidRequestError(str(exc)) from None
        _check_joinable(user.groups)
        self.b.require_writable()
        await self._propose_control(acl_user_put(record))
        return {"user": self._public_user(key), "created": known is None}

    async def acl_delete_user(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        key = self._acl_user(body_map(body))
        existed = key in self.b.state.acl.users
        self.b.require_writable()
        if existed:
            await self._propose_control(acl_user_delete(key))
        return {"deleted": existed and key not in self.b.state.acl.users}

    async def acl_get_users(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        users = self.b.state.acl.users
        return {"users": [users[k].to_public() for k in sorted(users)]}

    async def acl_grant(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = body_map(body)
        key = self._acl_user(body)
        topics, groups = body.get("topics") or {}, body.get("groups") or {}
        try:
            parsed_topics = parse_grants(topics, group=False)
            parsed_groups = parse_grants(groups, group=True)
            self._known_user(key).with_grants(parsed_topics, parsed_groups)
        except AclError as exc:
            raise InvalidRequestError(str(exc)) from None
        if not parsed_topics and not parsed_groups:
            raise InvalidRequestError("nothing to grant: give 'topics' and/or 'groups'")
        _check_joinable(parsed_groups)
        self.b.require_writable()
        await self._propose_control(acl_grant(
            key, {k: perm_name(v) for k, v in parsed_topics.items()},
            {k: perm_name(v) for k, v in parsed_groups.items()}))
        return {"user": self._public_user(key)}

    async def acl_revoke(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = body_map(body)
        key = self._acl_user(body)
        topics, groups = body.get("topics") or [], body.get("groups") or []
        if not (isinstance(topics, list) and isinstance(groups, list)
                and all(isinstance(n, str) for n in [*topics, *groups])):
            raise InvalidRequestError("fields 'topics' and 'groups' must be lists of names")
        if not topics and not groups:
            raise InvalidRequestError("nothing to revoke: give 'topics' and/or 'groups'")
        self._known_user(key)
        self.b.require_writable()
        await self._propose_control(acl_revoke(key, topics, groups))
        return {"user": self._public_user(key)}


def handlers_for(broker: BrokerView) -> dict[int, Handler]:
    h = Handlers(broker)
    return {
        RequestCode.SEND_MESSAGES: SendHandler(broker).send,
        RequestCode.PULL_MESSAGES: h.pull,
        RequestCode.CREATE_TOPIC: h.create_topic,
        RequestCode.DELETE_TOPIC: h.delete_topic,
        RequestCode.GET_TOPICS: h.get_topics,
        RequestCode.COMMIT_OFFSETS: h.commit_offsets,
        RequestCode.QUERY_OFFSET: h.query_offset,
        RequestCode.CLIENT_HEARTBEAT: h.heartbeat,
        RequestCode.GET_MEMBERS: h.members,
        RequestCode.GET_QUEUE_OFFSETS: h.queue_offsets,
        RequestCode.BROKER_STATUS: h.status,
        RequestCode.ACL_PUT_USER: h.acl_put_user,
        RequestCode.ACL_DELETE_USER: h.acl_delete_user,
        RequestCode.ACL_GET_USERS: h.acl_get_users,
        RequestCode.ACL_GRANT: h.acl_grant,
        RequestCode.ACL_REVOKE: h.acl_revoke,
    }



