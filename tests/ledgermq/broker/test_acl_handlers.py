"""ACL administration and enforcement on a real one-node broker (in process).

The ACL requests go over real sockets to an open broker (anyone may manage
users there, as anyone may create topics). Enforcement is driven through the
broker's own handler table with connections whose principal is set the way
the AUTH handshake sets it, so every request code's rule is pinned here; the
multi-process tests with the handshake itself are in test_acl_cluster.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    LedgerMQError,
    NoPermissionError,
    UnauthenticatedError,
)
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.wire import Connection, RpcClient
from ledgermq.wire.auth import CLUSTER_KEY, Principal, write_secret_file

pytestmark = pytest.mark.timeout(60)

SECRET = b"alice-secret-0123456789"


def config(tmp_path: Path, secured: bool, **overrides: Any) -> BrokerConfig:
    extra: dict[str, Any] = {}
    if secured:
        cluster, admin = tmp_path / "cluster.secret", tmp_path / "admin.secret"
        if not cluster.exists():
            write_secret_file(cluster)
            write_secret_file(admin)
        extra = {"cluster_secret_file": str(cluster), "admin_secret_file": str(admin)}
    return BrokerConfig(
        group="g1", node_id=1, data_dir=str(tmp_path / "n1"),
        peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")}, tick_ms=10,
        segment_size_bytes=1 << 20, **extra, **overrides)


@contextlib.asynccontextmanager
async def broker(tmp_path: Path, secured: bool) -> AsyncIterator[Broker]:
    b = Broker(config(tmp_path, secured))
    await b.start()
    try:
        await b.node.wait_leader_ready(10)
        yield b
    finally:
        await b.stop()


async def call(b: Broker, principal: Principal | None, code: int, body: Any,
               peer: str = "127.0.0.1:40000") -> Any:
    """One request through the broker's handler table, as a connection on
    which `principal` authenticated."""
    assert b.rpc is not None
    conn = Connection(peer=peer, role="client", principal=principal)
    return await b.rpc.handlers[code](body, conn)


async def refusal(b: Broker, principal: Principal | None, code: int, body: Any,
                  peer: str = "127.0.0.1:40000") -> LedgerMQError:
    with pytest.raises(LedgerMQError) as info:
        await call(b, principal, code, body, peer)
    return info.value


ADMIN = Principal("admin", admin=True)
PUBLISHER = Principal("pub")
CONSUMER = Principal("con")


async def setup_users(b: Broker) -> None:
    """Topic t with 3 messages; pub may PUB t; con may SUB t in group cg."""
    await call(b, ADMIN, RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
    await call(b, ADMIN, RequestCode.ACL_PUT_USER, {
        "access_key": "pub", "secret": SECRET, "topics": {"t": "PUB"}})
    await call(b, ADMIN, RequestCode.ACL_PUT_USER, {
        "access_key": "con", "secret": SECRET, "topics": {"t": "SUB"},
        "groups": {"cg": "SUB"}})
    await call(b, PUBLISHER, RequestCode.SEND_MESSAGES, {"messages": [
        {"topic": "t", "body": b"%d" % i} for i in range(3)]})


def test_acl_requests_over_the_wire_and_their_replay(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker(tmp_path, secured=False) as b:
            assert b.address is not None
            c = await RpcClient.connect(*b.address)
            try:
                put = await c.request(RequestCode.ACL_PUT_USER, {
                    "access_key": "alice", "secret": SECRET, "allow": ["10.0.0.0/8"],
                    "topics": {"t": "PUB", "*": "DENY"}, "groups": {"cg": "SUB"}})
                assert put == {"created": True, "user": {
                    "access_key": "alice", "admin": False, "allow": ["10.0.0.0/8"],
                    "topics": {"*": "DENY", "t": "PUB"}, "groups": {"cg": "SUB"}}}
                granted = await c.request(RequestCode.ACL_GRANT, {
                    "access_key": "alice", "topics": {"u": "pub|sub"}})
                assert granted["user"]["topics"] == {"*": "DENY", "t": "PUB", "u": "PUB|SUB"}
                revoked = await c.request(RequestCode.ACL_REVOKE, {
                    "access_key": "alice", "topics": ["t"], "groups": ["cg"]})
                assert revoked["user"]["topics"] == {"*": "DENY", "u": "PUB|SUB"}
                assert revoked["user"]["groups"] == {}
                # Replaced without a secret: admin flag set, secret kept.
                again = await c.request(RequestCode.ACL_PUT_USER, {
                    "access_key": "alice", "admin": True})
                assert again["created"] is False and again["user"]["admin"] is True
                await c.request(RequestCode.ACL_PUT_USER, {"access_key": "bob",
                                                           "secret": SECRET})
                listed = await c.request(RequestCode.ACL_GET_USERS, None)
                assert [u["access_key"] for u in listed["users"]] == ["alice", "bob"]
                assert "secret" not in str(listed) and SECRET not in repr(listed).encode()
                assert await c.request(RequestCode.ACL_DELETE_USER,
                                       {"access_key": "bob"}) == {"deleted": True}
                assert await c.request(RequestCode.ACL_DELETE_USER,
                                       {"access_key": "bob"}) == {"deleted": False}
                for code, body, words in [
                    (RequestCode.ACL_PUT_USER, {"access_key": "carol"}, "needs a secret"),
                    (RequestCode.ACL_PUT_USER, {"access_key": "carol", "secret": b"short"},
                     "at least 16 bytes"),
                    (RequestCode.ACL_PUT_USER, {"access_key": CLUSTER_KEY, "secret": SECRET},
                     "invalid access key"),
                    (RequestCode.ACL_PUT_USER, {"access_key": "admin", "secret": SECRET},
                     "bootstrap administrator"),
                    (RequestCode.ACL_PUT_USER, {"access_key": "carol", "secret": SECRET,
                                                "groups": {"g": "PUB"}}, "SUB or DENY"),
                    (RequestCode.ACL_GRANT, {"access_key": "nobody", "topics": {"t": "PUB"}},
                     "no ACL user"),
                    (RequestCode.ACL_GRANT, {"access_key": "alice"}, "nothing to grant"),
                    # A group no consumer could join: refused where it is asked for.
                    (RequestCode.ACL_PUT_USER, {"access_key": "carol", "secret": SECRET,
                                                "groups": {"g.h": "SUB"}},
                     "'g.h': no consumer can join"),
                    (RequestCode.ACL_GRANT, {"access_key": "alice", "groups": {"a.b": "SUB"}},
                     "'a.b': no consumer can join"),
                    (RequestCode.ACL_REVOKE, {"access_key": "alice", "topics": "t"},
                     "lists of names"),
                    (RequestCode.ACL_DELETE_USER, {"access_key": "a b"}, "invalid access key"),
                ]:
                    with pytest.raises(InvalidRequestError, match=words):
                        await c.request(code, body)
                assert "carol" not in b.state.acl.users
            finally:
                await c.close()
            users = dict(b.state.acl.users)
        # A restart replays the log into the same users.
        async with broker(tmp_path, secured=False) as b:
            assert b.state.acl.users == users
            assert b.state.acl.users["alice"].secret == SECRET
    loop.run(main())


def test_every_request_code_is_enforced_on_a_secured_broker(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker(tmp_path, secured=True) as b:
            await setup_users(b)
            pull = {"topic": "t", "queue_id": 0, "offset": 0}
            commit = {"group": "cg", "offsets": [["t", 0, 2]]}
            # The publisher: PUB on t and nothing else.
            for code, body, missing in [
                (RequestCode.PULL_MESSAGES, pull, "SUB on topic 't'"),
                (RequestCode.GET_QUEUE_OFFSETS, {"topic": "t", "queue_id": 0},
                 "SUB on topic 't'"),
                (RequestCode.QUERY_OFFSET, {"group": "cg", "topic": "t", "queue_id": 0},
                 "SUB on topic 't'"),
                (RequestCode.COMMIT_OFFSETS, commit, "SUB on consumer group 'cg'"),
                (RequestCode.CLIENT_HEARTBEAT, {"group": "cg", "client_id": "x"},
                 "SUB on consumer group 'cg'"),
                (RequestCode.GET_MEMBERS, {"group": "cg"}, "SUB on consumer group 'cg'"),
                (RequestCode.DELETE_TOPIC, {"topic": "t"}, "ADMIN"),
                (RequestCode.CREATE_TOPIC, {"topic": "t", "perm": 0}, "ADMIN"),
                (RequestCode.ACL_PUT_USER, {"access_key": "pub", "admin": True}, "ADMIN"),
                (RequestCode.ACL_GET_USERS, None, "ADMIN"),
                (RequestCode.ACL_GRANT, {"access_key": "pub", "topics": {"*": "PUB|SUB"}},
                 "ADMIN"),
                (RequestCode.ACL_REVOKE, {"access_key": "con", "topics": ["t"]}, "ADMIN"),
                (RequestCode.ACL_DELETE_USER, {"access_key": "con"}, "ADMIN"),
                (RequestCode.SEND_MESSAGES, {"messages": [{"topic": "other", "body": b"x"}]},
                 "PUB on topic 'other'"),
            ]:
                error = await refusal(b, PUBLISHER, code, body)
                assert isinstance(error, NoPermissionError), (code, error)
                assert missing in error.message, (code, error.message)
            # Nothing changed: the topic, its permission, the offset, the users.
            assert b.state.topics["t"].perm == 6
            assert b.state.offset_of("cg", "t", 0) == -1
            assert not b.state.acl.users["pub"].admin
            assert "other" not in b.state.topics
            for code in (RequestCode.GET_TOPICS, RequestCode.BROKER_STATUS):
                await call(b, PUBLISHER, code, None)
            # The consumer: SUB on t in cg; pull names its group when it has one.
            got = await call(b, CONSUMER, RequestCode.PULL_MESSAGES, {**pull, "group": "cg"})
            assert len(got["messages"]) == 3
            error = await refusal(b, CONSUMER, RequestCode.PULL_MESSAGES,
                                  {**pull, "group": "other"})
            assert "SUB on consumer group 'other'" in error.message
            await call(b, CONSUMER, RequestCode.COMMIT_OFFSETS, commit)
            assert b.state.offset_of("cg", "t", 0) == 2
            await call(b, CONSUMER, RequestCode.CLIENT_HEARTBEAT, {"group": "cg",
                                                                   "client_id": "c1"})
            assert await call(b, CONSUMER, RequestCode.GET_MEMBERS,
                              {"group": "cg"}) == {"members": ["c1"]}
            error = await refusal(b, CONSUMER, RequestCode.SEND_MESSAGES,
                                  {"messages": [{"topic": "t", "body": b"x"}]})
            assert "PUB on topic 't'" in error.message
            # Anyone else: the anonymous, an unknown key, no principal at all.
            for principal in (Principal("anonymous"), Principal("mallory")):
                error = await refusal(b, principal, RequestCode.GET_TOPICS, None)
                assert "is not an ACL user" in error.message
            error = await refusal(b, None, RequestCode.BROKER_STATUS, None)
            assert isinstance(error, UnauthenticatedError)
            # Cluster members and admins may do everything.
            member = Principal(CLUSTER_KEY, cluster_member=True)
            await call(b, member, RequestCode.ACL_GET_USERS, None)
            await call(b, ADMIN, RequestCode.CREATE_TOPIC, {"topic": "t", "perm": 4})
            assert b.state.topics["t"].perm == 4
            await call(b, ADMIN, RequestCode.DELETE_TOPIC, {"topic": "t"})
            assert "t" not in b.state.topics
    loop.run(main())


def test_grants_and_the_allow_list_take_effect_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker(tmp_path, secured=True) as b:
            await setup_users(b)
            pull = {"topic": "t", "queue_id": 0, "offset": 0}
            await refusal(b, PUBLISHER, RequestCode.PULL_MESSAGES, pull)
            await call(b, ADMIN, RequestCode.ACL_GRANT, {"access_key": "pub",
                                                         "topics": {"t": "PUB|SUB"}})
            await call(b, PUBLISHER, RequestCode.PULL_MESSAGES, pull)
            await call(b, ADMIN, RequestCode.ACL_PUT_USER, {
                "access_key": "pub", "allow": ["192.0.2.0/24"], "topics": {"t": "PUB|SUB"}})
            error = await refusal(b, PUBLISHER, RequestCode.PULL_MESSAGES, pull)
            assert "may not connect from 127.0.0.1" in error.message
            await call(b, PUBLISHER, RequestCode.PULL_MESSAGES, pull, peer="192.0.2.7:5555")
            await call(b, ADMIN, RequestCode.ACL_DELETE_USER, {"access_key": "pub"})
            error = await refusal(b, PUBLISHER, RequestCode.PULL_MESSAGES, pull,
                                  peer="192.0.2.7:5555")
            assert "is not an ACL user" in error.message
    loop.run(main())


def test_a_stranger_on_a_secured_broker_changes_nothing(tmp_path: Path) -> None:
    """The attacks of issue 15 over real sockets, without credentials: each is
    refused with UNAUTHENTICATED and the state is untouched."""
    async def main() -> None:
        async with broker(tmp_path, secured=True) as b:
            await setup_users(b)
            await call(b, CONSUMER, RequestCode.COMMIT_OFFSETS,
                       {"group": "cg", "offsets": [["t", 0, 1]]})
            assert b.address is not None
            for code, body in [
                (RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 3]]}),
                (RequestCode.CREATE_TOPIC, {"topic": "t", "perm": 0}),
                (RequestCode.DELETE_TOPIC, {"topic": "t"}),
                (RequestCode.ACL_PUT_USER, {"access_key": "evil", "secret": SECRET,
                                            "admin": True}),
            ]:
                c = await RpcClient.connect(*b.address)
                try:
                    with pytest.raises(UnauthenticatedError):
                        await c.request(code, body)
                finally:
                    await c.close()
            assert b.state.offset_of("cg", "t", 0) == 1
            assert b.state.topics["t"].perm == 6
            assert "evil" not in b.state.acl.users
    loop.run(main())
