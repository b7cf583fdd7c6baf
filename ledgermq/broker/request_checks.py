"""What every client request handler checks, shared by handlers.py and
send_handler.py: the body's fields (INVALID_REQUEST names the field), that
the connection's principal may make the request (the ACL, broker/acl.py, on a
broker with a cluster secret; an open broker checks nothing), and where it
may run (writes: the ready leader with disk space; reads: any node), and the
topics and queues it names.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ledgermq.base.errors import (
    InvalidRequestError,
    NoPermissionError,
    NotLeaderError,
    ServiceUnavailableError,
    UnknownTopicError,
)
from ledgermq.broker.acl import Action, peer_host
from ledgermq.broker.codec import group_field
from ledgermq.broker.control import PERM_WRITE, topic_put
from ledgermq.broker.state import TopicConfig
from ledgermq.broker.view import BrokerView, ControlOp
from ledgermq.wire import Connection

Body = dict[str, Any]  # a request's or answer's map


def body_map(body: Any) -> Body:
    """The request's body, which must be a map."""
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a map")
    return body


def body_field(body: Body, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """`body[key]` of type `kind` (a bool is not an int), or `default`;
    required when no default is given."""
    value = body.get(key, default)
    if value is ... or not isinstance(value, kind) or (
            isinstance(value, bool) and kind is int):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidRequestError(f"field {key!r} is required and must be {name}")
    return value


def nonneg_field(body: Body, key: str, default: Any = ...) -> int:
    """An int field that must not be negative."""
    value: int = body_field(body, key, int, default)
    if value < 0:
        raise InvalidRequestError(f"field {key!r} must not be negative")
    return value


class RequestChecks:
    """The checks and lookups every handler class builds on."""

    def __init__(self, broker: BrokerView) -> None:
        self.b = broker
        # Topics being auto-created by a send: later sends wait for the same one.
        self._creating: dict[str, asyncio.Task[None]] = {}

    # ---------------------------------------------------------------- ACL

    def _allow(self, conn: Connection, action: Action, topic: str | None = None,
               group: str | None = None) -> None:
        """Raise unless `conn`'s principal may do `action` (docs/security.md,
        "Authorisation: the ACL").
        A broker without a cluster secret runs open: everything is allowed."""
        if not self.b.config.cluster_secret_file:
            return
        self.b.state.acl.authorize(conn.principal, peer_host(conn.peer), action, topic, group)

    def _allow_pull(self, conn: Connection, body: Body, topic: str) -> None:
        """SUB on the topic, and on the consumer group when the request names one."""
        group = group_field(body) if body.get("group") is not None else None
        self._allow(conn, Action.SUB, topic, group)

    # ------------------------------------------------------------- topics

    async def _writable(self) -> None:
        """A send may go ahead here; during a failover it is held until the
        group has a leader again (`wait_writable`), not refused at once."""
        try:
            self.b.require_writable()
        except (NotLeaderError, ServiceUnavailableError):
            await self.b.wait_writable()

    def _require_space(self) -> None:
        """New messages are refused while the disk is above disk_hard_ratio
        (DISK_FULL); control operations are not: they are tiny, and trims and
        offset commits are how a full broker recovers."""
        retention = self.b.retention
        if retention is not None and retention.refusing:
            retention.require_space()

    def _topic(self, topic: str) -> TopicConfig:
        config = self.b.state.topics.get(topic)
        if config is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist", data={"topic": topic})
        return config

    def _queue(self, topic: str, queue_id: int) -> TopicConfig:
        """The topic of an existing queue: UNKNOWN_TOPIC, or INVALID_REQUEST
        for a queue id beyond the topic's queues."""
        config = self._topic(topic)
        if queue_id >= config.queues:
            raise InvalidRequestError(
                f"queue {queue_id} does not exist: topic {topic!r} has {config.queues} queues")
        return config

    async def _propose_control(self, op: ControlOp) -> None:
        assert self.b.controls is not None
        await self.b.controls.submit(op, 64)

    async def _topic_for_write(self, topic: str) -> TopicConfig:
        config = self.b.state.topics.get(topic)
        if config is None:
            if not self.b.config.auto_create_topics:
                raise UnknownTopicError(
                    f"topic {topic!r} does not exist and auto_create_topics is off",
                    data={"topic": topic})
            task = self._creating.get(topic)
            if task is None:
                task = asyncio.ensure_future(self._propose_control(
                    topic_put(topic, self.b.config.default_queues)))
                self._creating[topic] = task
                task.add_done_callback(lambda _t: self._creating.pop(topic, None))
            await asyncio.shield(task)
        return self._existing_topic_for_write(topic)

    def _existing_topic_for_write(self, topic: str) -> TopicConfig:
        config = self._topic(topic)
        if not config.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic!r} is not writable (perm {config.perm})",
                                    data={"topic": topic, "perm": config.perm})
        return config
