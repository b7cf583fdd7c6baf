"""The ACL end to end: a three-node broker group with a cluster secret, real
processes, clients authenticating with the AUTH handshake.

Replays issue 15's wire attacks with and without credentials (a publisher
that tries to pull, move a group's offset past unread messages, change a
topic's permission or delete it; a stranger with no credentials), and shows a
grant made before a leader change, and one made after it, enforced by every
replica, the restarted old leader included.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError, NoPermissionError, UnauthenticatedError
from ledgermq.broker.launcher import LocalCluster
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import Credentials, write_secret_file

pytestmark = pytest.mark.timeout(180)

PUB_SECRET = b"publisher-secret-0123456789"
CON_SECRET = b"consumer-secret-0123456789"
NOGROUP_SECRET = b"nogroup-secret-0123456789"
PUB = Credentials("pub", PUB_SECRET)
CON = Credentials("con", CON_SECRET)
NOGROUP = Credentials("nogroup", NOGROUP_SECRET)


async def request(address: str, creds: Credentials | None, code: int, body: Any) -> Any:
    """One request on a fresh connection that authenticated with `creds`."""
    host, port = split_host_port(address)
    auth: dict[str, Any] = {} if creds is None else {"credentials": creds}
    client = await RpcClient.connect(host, port, **auth)
    try:
        return await client.request(code, body)
    finally:
        await client.close()


async def refused(address: str, creds: Credentials | None, code: int, body: Any,
                  kind: type[LedgerMQError] = NoPermissionError) -> str:
    with pytest.raises(kind) as info:
        await request(address, creds, code, body)
    return info.value.message


async def eventually(check: Callable[[], Awaitable[None]], timeout: float = 15.0) -> None:
    """Retry `check` until it passes: followers apply committed entries a
    moment after the leader answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await check()
            return
        except (AssertionError, LedgerMQError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


class SecuredCluster(LocalCluster):
    def __init__(self, base: Path) -> None:
        cluster_secret, admin_secret = base / "cluster.secret", base / "admin.secret"
        base.mkdir(parents=True, exist_ok=True)
        write_secret_file(cluster_secret)
        self.admin = Credentials("admin", write_secret_file(admin_secret))
        super().__init__(base, nodes=3, settings={
            "cluster_secret_file": str(cluster_secret),
            "admin_secret_file": str(admin_secret)})

    def address(self, nid: int) -> str:
        return self.client_address(nid)

    async def leader(self, exclude: tuple[int, ...] = (), timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for nid in self.alive():
                if nid in exclude:
                    continue
                try:
                    status = await request(self.address(nid), self.admin,
                                           RequestCode.BROKER_STATUS, None)
                except (LedgerMQError, OSError):
                    continue
                if status.get("role") == "leader" and status.get("leader_ready"):
                    return nid
            await asyncio.sleep(0.1)
        raise TimeoutError("no ready leader")


PULL = {"topic": "t", "queue_id": 0, "offset": 0, "group": "cg"}


def test_acl_enforced_by_every_replica_across_a_leader_change(tmp_path: Path) -> None:
    cluster = SecuredCluster(tmp_path / "cluster")
    cluster.start()

    async def main() -> None:
        admin = cluster.admin
        leader = await cluster.leader()
        at = cluster.address(leader)
        await request(at, admin, RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
        for creds, grants in [(PUB, {"topics": {"t": "PUB"}}),
                              (CON, {"topics": {"t": "SUB"}, "groups": {"cg": "SUB"}}),
                              (NOGROUP, {"topics": {"t": "SUB"}})]:
            await request(at, admin, RequestCode.ACL_PUT_USER, {
                "access_key": creds.access_key, "secret": creds.secret, **grants})
        await request(at, PUB, RequestCode.SEND_MESSAGES, {"messages": [
            {"topic": "t", "body": b"m%d" % i} for i in range(8)]})
        await request(at, CON, RequestCode.COMMIT_OFFSETS,
                      {"group": "cg", "offsets": [["t", 0, 0]]})

        # A user with PUB only cannot read, move offsets, or touch the topic.
        assert "lacks SUB on topic 't'" in await refused(
            at, PUB, RequestCode.PULL_MESSAGES, PULL)
        assert "lacks SUB on consumer group 'cg'" in await refused(
            at, PUB, RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 8]]})
        assert "lacks ADMIN" in await refused(at, PUB, RequestCode.DELETE_TOPIC, {"topic": "t"})
        assert "lacks ADMIN" in await refused(at, PUB, RequestCode.CREATE_TOPIC,
                                              {"topic": "t", "perm": 0})
        # SUB on the topic but not on the group: the commit past the 8 unread
        # messages is refused and the offset stays.
        assert "lacks SUB on consumer group 'cg'" in await refused(
            at, NOGROUP, RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 8]]})
        # A stranger without credentials gets nowhere; nor does a wrong secret.
        for code, body in [(RequestCode.DELETE_TOPIC, {"topic": "t"}),
                           (RequestCode.COMMIT_OFFSETS,
                            {"group": "cg", "offsets": [["t", 0, 8]]}),
                           (RequestCode.CREATE_TOPIC, {"topic": "t", "perm": 0})]:
            await refused(at, None, code, body, UnauthenticatedError)
        await refused(at, Credentials("pub", b"not-the-secret-at-all"),
                      RequestCode.BROKER_STATUS, None, UnauthenticatedError)
        assert await request(at, CON, RequestCode.QUERY_OFFSET,
                             {"group": "cg", "topic": "t", "queue_id": 0}) == {"offset": 0}
        topics = await request(at, PUB, RequestCode.GET_TOPICS, None)
        assert topics["topics"]["t"]["perm"] == 6
        pulled = await request(at, CON, RequestCode.PULL_MESSAGES, PULL)
        assert len(pulled["messages"]) == 8

        # A grant made before the leader change holds on every replica.
        await request(at, admin, RequestCode.ACL_GRANT, {"access_key": "pub",
                                                         "topics": {"t": "PUB|SUB"}})
        for nid in cluster.alive():
            async def can_pull(address: str = cluster.address(nid)) -> None:
                await request(address, PUB, RequestCode.PULL_MESSAGES,
                              {"topic": "t", "queue_id": 0, "offset": 0})
            await eventually(can_pull)

        cluster.kill(leader)
        new = await cluster.leader(exclude=(leader,))
        at = cluster.address(new)
        await request(at, PUB, RequestCode.PULL_MESSAGES,
                      {"topic": "t", "queue_id": 0, "offset": 0})
        assert "lacks ADMIN" in await refused(at, PUB, RequestCode.DELETE_TOPIC, {"topic": "t"})
        assert "lacks SUB on consumer group 'cg'" in await refused(
            at, NOGROUP, RequestCode.COMMIT_OFFSETS, {"group": "cg", "offsets": [["t", 0, 8]]})
        # A change made on the new leader reaches every replica, the old leader
        # too once it is back (its log replayed and caught up).
        await request(at, admin, RequestCode.ACL_GRANT, {"access_key": "pub",
                                                         "topics": {"t": "PUB"}})
        cluster.start_node(leader)
        for nid in cluster.alive():
            async def cannot_pull(address: str = cluster.address(nid)) -> None:
                # Not pytest.raises: its failure is no AssertionError to retry on.
                try:
                    await request(address, PUB, RequestCode.PULL_MESSAGES,
                                  {"topic": "t", "queue_id": 0, "offset": 0})
                except NoPermissionError as exc:
                    assert "lacks SUB on topic 't'" in exc.message
                else:
                    raise AssertionError(f"{address} still lets pub pull")
                assert await request(address, CON, RequestCode.QUERY_OFFSET, {
                    "group": "cg", "topic": "t", "queue_id": 0}) == {"offset": 0}
            await eventually(cannot_pull, timeout=60)
        users = await request(cluster.address(leader), admin, RequestCode.ACL_GET_USERS, None)
        assert [u["access_key"] for u in users["users"]] == ["con", "nogroup", "pub"]

    try:
        loop.run(main())
    finally:
        cluster.stop()
