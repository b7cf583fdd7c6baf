"""Request codes: the one table every server's dispatch uses.

Numbers are part of the wire protocol (docs/protocol.md). Ranges keep owners
apart so that adding a request never renumbers another: 1-99 connection level,
100-199 NameServer, 200-399 broker (client-facing), 400-499 node runtime (peer
transport). New requests are added here as new members; a server that does not
handle a code answers UNKNOWN_REQUEST.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    # Connection level, answered by the RPC layer itself.
    HELLO = 1
    PING = 2
    # The answer to the server's HELLO challenge (docs/security.md).
    AUTH = 3

    # NameServer.
    REGISTER_BROKER = 100
    UNREGISTER_BROKER = 101
    BROKER_HEARTBEAT = 102
    GET_ROUTE = 103
    GET_CLUSTER = 104

    # Broker (client-facing); bodies in docs/protocol.md "Broker".
    SEND_MESSAGES = 200
    PULL_MESSAGES = 201
    CREATE_TOPIC = 202
    DELETE_TOPIC = 203
    GET_TOPICS = 204
    COMMIT_OFFSETS = 205
    QUERY_OFFSET = 206
    CLIENT_HEARTBEAT = 207
    GET_MEMBERS = 208
    GET_QUEUE_OFFSETS = 209
    BROKER_STATUS = 210
    # ACL administration (admin only; docs/protocol.md "ACL", docs/security.md).
    ACL_PUT_USER = 211
    ACL_DELETE_USER = 212
    ACL_GET_USERS = 213
    ACL_GRANT = 214
    ACL_REVOKE = 215
