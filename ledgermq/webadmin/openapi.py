"""The OpenAPI 3.1 description of the admin API, served at /openapi.json.

One table of operations for both servers: most paths exist on brokers and on
the NameServer with the same shapes (the NameServer aggregates every group and
forwards writes to the right leader); `servers` says which one answers.
docs/operations.md is the prose reference.
"""

from __future__ import annotations

from typing import Any, NamedTuple

_ERROR = {"$ref": "#/components/schemas/Error"}
_OBJ = {"type": "object"}



class Operation(NamedTuple):
    """One admin API operation: the route both the OpenAPI document and the
    servers' routers are made from (`ledgermq.webadmin.app.add_operations`)."""

    method: str
    path: str
    name: str  # the operationId, and the name of the handler a server gives for it
    summary: str
    servers: str  # "broker", "namesrv" or "both"
    schema: dict[str, Any] | None  # the request body's JSON schema
    answers: dict[int, str]  # status -> description


# Served by add_common_routes for every server, not by a server's own handler.
COMMON_OPERATIONS = frozenset({"info", "reports"})

OPERATIONS: list[Operation] = [
    Operation("get", "/api/v1/info", "info",
              "Which kind of server answers, and its clock.", "both", None,
              {200: "kind and time_ms"}),
    Operation("get", "/api/v1/cluster", "cluster",
              "Groups, nodes, roles, terms, indexes and lag.", "both", None,
              {200: "groups"}),
    Operation("get", "/api/v1/status", "status",
              "This broker node's full status (Raft runtime included).",
              "broker", None, {200: "status"}),
    Operation("get", "/api/v1/topics", "topics",
              "Every topic with its queues and message counts.", "both", None,
              {200: "topics"}),
    Operation("post", "/api/v1/topics", "create_topic",
              "Create a topic (or replace its configuration).", "both",
              {"type": "object", "required": ["topic"], "properties": {
                  "topic": {"type": "string"}, "queues": {"type": "integer", "minimum": 1,
                                                          "maximum": 1024},
                  "perm": {"type": "integer", "enum": [0, 2, 4, 6]},
                  "group": {"type": "string", "description": "NameServer only: one broker group"}}},
              {201: "the topic", 400: "bad input", 409: "this broker is not the leader"}),
    Operation("get", "/api/v1/topics/{topic}", "describe_topic",
              "One topic: queues and their offsets.", "both", None,
              {200: "the topic", 404: "unknown topic"}),
    Operation("put", "/api/v1/topics/{topic}", "update_topic",
              "Change queues (grow only) or permissions.", "both",
              {"type": "object", "properties": {"queues": {"type": "integer"},
                                                "perm": {"type": "integer"}}},
              {200: "the topic", 400: "bad input", 404: "unknown topic"}),
    Operation("delete", "/api/v1/topics/{topic}", "delete_topic",
              "Delete a topic's configuration.", "both", None,
              {200: "deleted", 404: "unknown topic"}),
    Operation("get", "/api/v1/consumer-groups", "consumer_groups",
              "Consumer groups with total lag and members.", "both",
              None, {200: "consumer_groups"}),
    Operation("get", "/api/v1/consumer-groups/{group}", "consumer_group",
              "Offsets and lag per queue of one group.",
              "both", None, {200: "the group", 404: "unknown group"}),
    Operation("post", "/api/v1/consumer-groups/{group}/reset-offsets", "reset_offsets",
     "Reset the group's offsets of a topic to the first message stored at or after a time,"
              " or to an offset.",
              "both", {"type": "object", "required": ["topic"], "properties": {
                  "topic": {"type": "string"},
                  "timestamp_ms": {"type": "integer",
                                   "description": "required unless offset is given"},
                  "offset": {"type": "integer",
                             "description": "clamped to each queue's range"},
                  "queue_id": {"type": "integer",
                               "description": "only this queue (default: all)"},
                  "dry_run": {"type": "boolean",
                              "description": "answer the same, change nothing"}}},
              {200: "new offsets", 400: "bad input", 404: "unknown topic"}),
    Operation("get", "/api/v1/messages/{msg_id}", "message_by_id",
              "Look a message up by its offset message id.", "both",
              None, {200: "the message", 400: "malformed id", 404: "no such message"}),
    Operation("get", "/api/v1/messages", "messages_by_key",
              "Look messages up by key (bounded scan, newest first).",
              "both", None,
              {200: "matches", 400: "topic and key are required", 404: "unknown topic"}),
    Operation("post", "/api/v1/leadership/transfer", "transfer_leadership",
              "Hand a group's leadership to another node.",
              "both", {"type": "object", "required": ["to"], "properties": {
                  "to": {"type": "integer"},
                  "group": {"type": "string", "description": "NameServer only: the group"}}},
              {200: "new leader", 400: "unknown node", 409: "not the leader",
               503: "transfer failed"}),
    Operation("get", "/api/v1/members", "members",
              "The group's configuration: voters and learners with their addresses and"
              " data-directory ids, the CONFIG entry in effect and whether it is committed;"
              " the leader adds each member's replication state (match, lag, identity).",
              "both", None, {200: "the configuration (NameServer: {groups: {name: ...}})"}),
    Operation("post", "/api/v1/members/{action}", "change_members",
              "Change the group's membership, one single-server CONFIG entry at a time:"
              " add (learner, then promoted once caught up), promote, remove, replace"
              " (add the new node, promote it, remove the old) or rejoin (a member with a"
              " new data directory becomes a learner again, then is promoted).",
              "both", {"type": "object", "required": ["node_id"], "properties": {
                  "node_id": {"type": "integer", "minimum": 1,
                              "description": "the node added, removed, promoted or rejoined;"
                                             " for replace: the old node"},
                  "new_node_id": {"type": "integer", "minimum": 1,
                                  "description": "replace only: the node that takes over"},
                  "address": {"type": "string",
                              "description": "add/replace: the new node's Raft HOST:PORT"},
                  "client_address": {"type": "string",
                                     "description": "add/replace: where its clients connect"
                                                    " (HOST:PORT; leader hints)"},
                  "directory_id": {"type": "integer", "minimum": 0,
                                   "description": "the node's data-directory id (0: the one"
                                                  " the leader hears from it)"},
                  "learner": {"type": "boolean",
                              "description": "add/rejoin: stay a learner (no promotion)"},
                  "force": {"type": "boolean",
                            "description": "remove: even if the voters left are not a"
                                           " healthy majority"},
                  "timeout": {"type": "number", "minimum": 0.1, "maximum": 600},
                  "group": {"type": "string",
                            "description": "NameServer only: the broker group (default:"
                                           " the only one registered)"}}},
              {200: "the steps committed and the new configuration", 400: "bad input",
               409: "not the leader, refused, or leadership moved (retry)",
               503: "not committed or not caught up in time"}),
    Operation("get", "/api/v1/retention", "retention",
              "Retention settings, disk usage, the retained log range (first/last index and"
              " time), the newest snapshot and the trim points; the NameServer lists every"
              " node of every group (or of ?group=).", "both", None,
              {200: "retention (NameServer: {groups: {name: {nodes: [...]}}})"}),
    Operation("post", "/api/v1/retention/trim", "retention_trim",
              "Delete up to an index or position: propose the group's trim point (whole"
              " segments go on each replica once a local snapshot covers them).",
              "both", {"type": "object", "properties": {
                  "index": {"type": "integer", "minimum": 0,
                            "description": "entries below this index may go"},
                  "position": {"type": "integer", "minimum": 0,
                               "description": "or: CommitLog bytes below this position"},
                  "dry_run": {"type": "boolean",
                              "description": "answer the same, propose nothing"},
                  "group": {"type": "string",
                            "description": "NameServer only: the broker group (default:"
                                           " the only one registered)"}}},
              {200: "the trim point proposed", 400: "bad input", 409: "not the leader"}),
    Operation("get", "/api/v1/audit", "audit",
              "The nightly audit's latest verdict, from latest.json in the reports directory"
              " (or in its only subdirectory holding one): state passed, failed, stale (older"
              " than --audit-stale-hours) or unreadable (with the problem), the night's"
              " document, when the last night that passed finished, and the cross-night"
              " report under /reports/.", "namesrv", None,
              {200: "the verdict", 404: "no reports directory, or no latest.json in it"}),
    Operation("get", "/api/v1/reports", "reports",
              "Chaos and audit reports found in the reports directory.",
              "both", None, {200: "reports"}),
]


def operations(kind: str) -> list[Operation]:
    """The operations a server of `kind` ("broker" or "namesrv") answers."""
    return [op for op in OPERATIONS if op.servers in ("both", kind)]


def openapi_document(kind: str) -> dict[str, Any]:
    """The API description as served by a `kind` ("broker" or "namesrv") app."""
    paths: dict[str, Any] = {}
    for method, path, name, summary, _, schema, answers in operations(kind):
        op: dict[str, Any] = {"operationId": name, "summary": summary, "responses": {}}
        params = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True,
                                 "schema": {"type": "string"}} for p in params]
        if path == "/api/v1/messages":
            op["parameters"] = [
                {"name": n, "in": "query", "required": n in ("topic", "key"),
                 "schema": {"type": "integer" if n in ("limit", "scan_max") else "string"}}
                for n in ("topic", "key", "limit", "scan_max")]
        if schema is not None:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": schema}}}
        # Signed by any key for reads, by an administrator for writes (when
        # the server has a cluster secret); else the token for writes.
        op["security"] = ([{"signed": []}, {"token": []}] if method != "get"
                          else [{"signed": []}, {}])
        answers = {**answers, 401: answers.get(401, "no valid signature (or token)")}
        if method != "get":
            answers[403] = answers.get(403, "not an administrator (or a wrong token)")
        for status, text in sorted(answers.items()):
            body = _ERROR if status >= 400 else _OBJ
            op["responses"][str(status)] = {
                "description": text, "content": {"application/json": {"schema": body}}}
        op["responses"].setdefault("default", {
            "description": "error", "content": {"application/json": {"schema": _ERROR}}})
        paths.setdefault(path, {})[method] = op
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics (text exposition format).",
                                 "responses": {"200": {"description": "metrics"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": f"LedgerMQ {kind} admin API", "version": "1",
                 "description": "JSON in and out; errors are {error: {code, message, data}}."
                                " With a cluster secret every request is signed"
                                " (Authorization: LMQ-HMAC-SHA256 ..., docs/security.md) and"
                                " writes need an administrator; without one, writes need the"
                                " admin token when one is configured."},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "signed": {"type": "http", "scheme": "LMQ-HMAC-SHA256",
                           "description": "Credential, Timestamp, Nonce, Signature over the"
                                          " canonical request (docs/security.md)"},
                "token": {"type": "http", "scheme": "bearer",
                          "description": "admin_token, only on servers without a cluster"
                                         " secret"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {
                "error": {"type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"},
                    "data": {}}}}}},
        },
    }
