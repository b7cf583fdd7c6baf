"""Value types of the client SDK: what is sent, what comes back, and where;
and the credentials it authenticates with."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ledgermq.wire.auth import Credentials, read_secret_file

ACCESS_KEY_ENV = "LEDGERMQ_ACCESS_KEY"
SECRET_FILE_ENV = "LEDGERMQ_SECRET_FILE"


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials from LEDGERMQ_ACCESS_KEY and the secret in the file named by
    LEDGERMQ_SECRET_FILE (0600, as `read_secret_file` demands); None when
    neither is set. ValueError when only one is set or the file is refused."""
    env = os.environ if env is None else env
    key, path = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_FILE_ENV, "")
    if not key and not path:
        return None
    if not key or not path:
        raise ValueError(f"{ACCESS_KEY_ENV} and {SECRET_FILE_ENV} are set together")
    return Credentials(key, read_secret_file(path))


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic, on one broker group."""

    topic: str
    group: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.group}#{self.queue_id}"


@dataclass
class Message:
    """A message to send. `properties` are free-form string pairs."""

    body: bytes
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


@dataclass(frozen=True)
class SendResult:
    """Where a sent message was stored. `queue_offset` is None when the group
    acknowledges before commit (replicate=async), or for an old duplicate."""

    msg_id: str | None
    queue: MessageQueue
    queue_offset: int | None
    duplicate: bool = False

    def __getattr__(self, name: str) -> Any:
        # The producer stores the message id of a fresh result unformatted, as
        # (group, physical offset) (`stored_result`); it is formatted on first
        # use, so callers that never read it do not pay for it.
        if name == "msg_id":
            fields = self.__dict__
            if "_group" in fields:
                msg_id = fields["msg_id"] = f"{fields['_group']}@{fields['_offset']:016X}"
                return msg_id
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_new = object.__new__


def stored_result(group: str, offset: int, queue: MessageQueue,
                  queue_offset: int | None) -> SendResult:
    """SendResult(f"{group}@{offset:016X}", queue, queue_offset), with the id
    formatted when first read and without the frozen dataclass's setattr calls."""
    result = _new(SendResult)
    fields = result.__dict__
    fields["_group"] = group
    fields["_offset"] = offset
    fields["queue"] = queue
    fields["queue_offset"] = queue_offset
    fields["duplicate"] = False
    return result


@dataclass
class ReceivedMessage:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str
    keys: str
    properties: dict[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    producer_id: int
    sequence: int
    reconsume_times: int
    group: str = ""

    @classmethod
    def from_wire(cls, raw: dict[str, Any], group: str) -> ReceivedMessage:
        return cls(
            msg_id=raw["msg_id"], topic=raw["topic"], queue_id=raw["queue_id"],
            queue_offset=raw["queue_offset"], body=raw["body"], tags=raw.get("tags", ""),
            keys=raw.get("keys", ""), properties=raw.get("properties") or {},
            born_timestamp_ms=raw.get("born_timestamp_ms", 0),
            store_timestamp_ms=raw.get("store_timestamp_ms", 0),
            producer_id=raw.get("producer_id", 0), sequence=raw.get("sequence", 0),
            reconsume_times=raw.get("reconsume_times", 0), group=group,
        )

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.group, self.queue_id)


@dataclass(frozen=True)
class PullResult:
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    # Set when the offset asked for had been deleted by retention and the
    # pull continued from the oldest retained message instead
    # (`on_offset_moved="earliest"`): the offset that was asked for.
    moved_from: int | None = None
