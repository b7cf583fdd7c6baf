"""CONTROL entry bodies: broker metadata replicated through the Raft log.

Schema (msgpack map, documented in docs/broker.md):

    {"v": 1, "ops": [op, ...]}
    op = {"op": "topic.put",      "topic": str, "queues": int, "perm": int}
       | {"op": "topic.delete",   "topic": str}
       | {"op": "offsets.commit", "offsets": [[group, topic, queue_id, offset], ...]}
       | {"op": "offsets.reset",  "offsets": [[group, topic, queue_id, offset], ...]}
       | {"op": "acl.user.put",    "user": {access_key, secret?, admin, allow, topics, groups}}
       | {"op": "acl.user.delete", "access_key": str}
       | {"op": "acl.grant",       "access_key": str, "topics": {name: perm}, "groups": {...}}
       | {"op": "acl.revoke",      "access_key": str, "topics": [name], "groups": [name]}
       | {"op": "log.trim",        "position": int}

The ACL operations (broker/acl.py, docs/security.md, "Authorisation: the ACL") carry users'
secrets: a user put without "secret" keeps the user's current one.

`topic.delete` deletes: the topic's configuration, queue counters and consumer
offsets go, and its messages in earlier entries are never indexed again (a
re-created topic starts at queue offset 0). `log.trim` raises the group's
agreed retention point: every replica may delete CommitLog segments wholly
below it (docs/broker.md, "Retention").

Several operations share one entry so that concurrent offset commits cost one
proposal (group commit). Unknown ops are skipped by the state machine, so a
newer broker can add operations that an older replica ignores rather than
crashes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

CONTROL_VERSION = 1
PERM_READ = 4
PERM_WRITE = 2
PERM_RW = PERM_READ | PERM_WRITE
MAX_QUEUES = 1024


def topic_put(topic: str, queues: int, perm: int = PERM_RW) -> dict[str, Any]:
    return {"op": "topic.put", "topic": topic, "queues": queues, "perm": perm}


def topic_delete(topic: str) -> dict[str, Any]:
    return {"op": "topic.delete", "topic": topic}


def log_trim(position: int) -> dict[str, Any]:
    """Raise the agreed retention point to CommitLog position `position`."""
    return {"op": "log.trim", "position": position}


def offsets_commit(offsets: Sequence[tuple[str, str, int, int]]) -> dict[str, Any]:
    return {"op": "offsets.commit", "offsets": [list(o) for o in offsets]}


def offsets_reset(offsets: Sequence[tuple[str, str, int, int]]) -> dict[str, Any]:
    """An admin offset reset: unlike a commit, it may move an offset backwards."""
    return {"op": "offsets.reset", "offsets": [list(o) for o in offsets]}


def acl_user_put(user: dict[str, Any]) -> dict[str, Any]:
    """Create or replace a user (`acl.User.to_record` form; no "secret": keep it)."""
    return {"op": "acl.user.put", "user": user}


def acl_user_delete(access_key: str) -> dict[str, Any]:
    return {"op": "acl.user.delete", "access_key": access_key}


def acl_grant(access_key: str, topics: dict[str, str], groups: dict[str, str]) -> dict[str, Any]:
    """Add or replace grants of a user (perms spelled as on the wire)."""
    return {"op": "acl.grant", "access_key": access_key, "topics": topics, "groups": groups}


def acl_revoke(access_key: str, topics: Sequence[str], groups: Sequence[str]) -> dict[str, Any]:
    """Remove grants of a user (the names then fall back to its "*" grant)."""
    return {"op": "acl.revoke", "access_key": access_key, "topics": list(topics),
            "groups": list(groups)}


def encode_control(ops: Sequence[dict[str, Any]]) -> bytes:
    data: bytes = msgpack.packb({"v": CONTROL_VERSION, "ops": list(ops)}, use_bin_type=True)
    return data


def decode_control(body: bytes) -> list[dict[str, Any]]:
    """The operations of a CONTROL body; ValueError if it is not this schema."""
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"CONTROL body is not msgpack: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ops"), list):
        raise ValueError("CONTROL body must be a map with an 'ops' list")
    return [op for op in doc["ops"] if isinstance(op, dict)]
