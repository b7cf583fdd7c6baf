"""Authentication of the admin HTTP API, over real HTTPS on a running 3-node
group whose servers all have a cluster secret (docs/security.md, "The admin HTTP API"):
anonymous and token-bearing writes are refused and change nothing, signed
requests work (the NameServer forwarding as a cluster member), replayed,
stale and tampered requests are refused, and the public pages stay public."""

from __future__ import annotations

import asyncio
import time

import pytest
from ops.support import SecureOpsCluster, http, signed, wait_group_ready

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.client import Producer
from ledgermq.client.admin import AdminApi, AdminApiError
from ledgermq.wire.auth import Credentials

pytestmark = [pytest.mark.timeout(180)]


def run(coro):
    return loop.run(coro)


def code_of(answer: tuple) -> tuple[int, str]:
    status, body = answer[0], answer[1]
    assert isinstance(body, dict) and body.get("error", {}).get("message"), answer
    return status, body["error"]["code"]


async def _setup(c: SecureOpsCluster) -> tuple[int, str, AdminApi]:
    """Leader id, its admin URL, and an admin client of the NameServer; the
    topic AuthT exists with 6 messages and group auth-cg sits at offset 2."""
    leader = await wait_leader(c)
    await wait_group_ready(c)
    api = AdminApi(c.namesrv_url, credentials=c.admin, ca_file=c.ca_file)
    await api.call("POST", "topics", {"topic": "AuthT", "queues": 1})
    async with Producer([c.namesrv_address], **c.client_options()) as producer:
        for i in range(6):
            await producer.send("AuthT", b"m%d" % i)
    await api.call("POST", "consumer-groups/auth-cg/reset-offsets",
                   {"topic": "AuthT", "offset": 2})
    return leader, await c.admin_url(leader), api


async def _offset(api: AdminApi) -> int:
    group = await api.call("GET", "consumer-groups/auth-cg")
    return group["topics"]["AuthT"][0]["offset"]


def test_writes_without_valid_credentials_are_refused_and_change_nothing(
        secure_cluster: SecureOpsCluster) -> None:
    c = secure_cluster

    async def main() -> None:
        leader, leader_url, api = await _setup(c)
        other = leader % 3 + 1
        assert await _offset(api) == 2
        wrong = Credentials("admin", b"not-the-admin-secret-at-all")
        stranger = Credentials("mallory", b"mallory-has-a-secret-too")
        writes = [("POST", "consumer-groups/auth-cg/reset-offsets",
                   {"topic": "AuthT", "offset": 0}),
                  ("DELETE", "topics/AuthT", None),
                  ("POST", "leadership/transfer", {"group": "broker-a", "to": other}),
                  ("POST", "topics", {"topic": "Sneaky"})]
        for base in (c.namesrv_url, leader_url):
            for method, path, body in writes:
                url = f"{base}/api/v1/{path}"
                # Anonymous, with a bearer token (the old admin_token), a
                # wrong secret, an unknown key: 401, JSON error.
                for answer in (await http(method, url, body, ca_file=c.ca_file),
                               await http(method, url, body, token="ops-test-token",
                                          ca_file=c.ca_file),
                               await signed(method, url, body, credentials=wrong,
                                            ca_file=c.ca_file),
                               await signed(method, url, body, credentials=stranger,
                                            ca_file=c.ca_file)):
                    assert code_of(answer) == (401, "UNAUTHENTICATED"), (method, url, answer)
        await asyncio.sleep(1.0)  # a transfer that slipped through would be done by now
        assert await _offset(api) == 2
        topics = [t["topic"] for t in (await api.call("GET", "topics"))["topics"]]
        assert "AuthT" in topics and "Sneaky" not in topics
        assert await wait_leader(c) == leader
        # Reads need a signature too; the public pages do not.
        for url in (f"{c.namesrv_url}/api/v1/topics", f"{leader_url}/api/v1/cluster",
                    f"{leader_url}/api/v1/status", f"{c.namesrv_url}/api/v1/info"):
            assert code_of(await http("GET", url, ca_file=c.ca_file)) == \
                (401, "UNAUTHENTICATED")
        for base in (c.namesrv_url, leader_url):
            for path in ("/", "/static/app.js", "/static/sign.js", "/openapi.json", "/metrics"):
                status, _ = await http("GET", f"{base}{path}", ca_file=c.ca_file)
                assert status == 200, path
        # Refusals are counted by reason.
        _, metrics = await http("GET", f"{leader_url}/metrics", ca_file=c.ca_file)
        assert 'ledgermq_auth_failures_total{port="admin",reason="missing"}' in metrics
        assert 'ledgermq_auth_failures_total{port="admin",reason="bad_signature"}' in metrics
        await api.close()

    run(main())


def test_signed_requests_replay_skew_and_tampering(secure_cluster: SecureOpsCluster) -> None:
    c = secure_cluster

    async def main() -> None:
        _, leader_url, api = await _setup(c)
        for base in (c.namesrv_url, leader_url):
            url = f"{base}/api/v1/consumer-groups/auth-cg/reset-offsets"
            body = {"topic": "AuthT", "offset": 3, "dry_run": True}
            status, answer, header = await signed("POST", url, body, credentials=c.admin,
                                                  ca_file=c.ca_file)
            assert status == 200, answer
            # The same request again (same nonce): refused.
            replay = await signed("POST", url, body, header=header, ca_file=c.ca_file)
            assert code_of(replay) == (401, "UNAUTHENTICATED")
            assert "nonce" in replay[1]["error"]["message"]
            # Timestamps six minutes off, either way.
            for skew in (-360_000, 360_000):
                stale = await signed("POST", url, body, credentials=c.admin, ca_file=c.ca_file,
                                     timestamp_ms=int(time.time() * 1000) + skew)
                assert code_of(stale) == (401, "UNAUTHENTICATED")
                assert "clock" in stale[1]["error"]["message"]
            # A body other than the one signed (offset 3 -> 0, no dry run).
            tampered = await signed("POST", url, body, credentials=c.admin, ca_file=c.ca_file,
                                    send_body=b'{"topic": "AuthT", "offset": 0}')
            assert code_of(tampered) == (401, "UNAUTHENTICATED")
            # A signature made for another path.
            _, _, other = await signed("POST", f"{base}/api/v1/consumer-groups/x/reset-offsets",
                                       body, credentials=c.admin, ca_file=c.ca_file)
            assert code_of(await signed("POST", url, body, header=other,
                                        ca_file=c.ca_file)) == (401, "UNAUTHENTICATED")
            # A query other than the one signed.
            _, _, q1 = await signed("GET", f"{base}/api/v1/messages?topic=AuthT&key=a",
                                    credentials=c.admin, ca_file=c.ca_file)
            assert code_of(await signed("GET", f"{base}/api/v1/messages?topic=AuthT&key=b",
                                        header=q1, ca_file=c.ca_file))[0] == 401
        assert await _offset(api) == 2
        # Query order and escaping do not matter: the canonical form sorts and re-encodes.
        status, answer, _ = await signed(
            "GET", f"{c.namesrv_url}/api/v1/messages?key=k%31&topic=AuthT&limit=5",
            credentials=c.admin, ca_file=c.ca_file)
        assert status == 200 and answer["topic"] == "AuthT", answer
        # A real write, through the NameServer (it signs as a cluster member
        # towards the leader), then directly on the leader.
        await api.call("POST", "consumer-groups/auth-cg/reset-offsets",
                       {"topic": "AuthT", "offset": 5})
        assert await _offset(api) == 5
        direct = AdminApi(leader_url, credentials=c.admin, ca_file=c.ca_file)
        await direct.call("POST", "consumer-groups/auth-cg/reset-offsets",
                          {"topic": "AuthT", "offset": 2})
        assert await _offset(api) == 2
        await direct.close()
        # The cluster key is accepted by a broker (that is how the NameServer forwards).
        member = AdminApi(leader_url, credentials=c.cluster_member, ca_file=c.ca_file)
        assert (await member.call("GET", "topics/AuthT"))["topic"] == "AuthT"
        await member.close()
        await api.close()

    run(main())


def test_tls_is_verified(secure_cluster: SecureOpsCluster) -> None:
    """The admin apps serve HTTPS with the configured certificate: the
    NameServer reaches the brokers' apps through it (https admin URLs in the
    cluster view), a client with the CA connects, one without it does not."""
    c = secure_cluster

    async def main() -> None:
        assert c.namesrv_url.startswith("https://")
        api = AdminApi(c.namesrv_url, credentials=c.admin, ca_file=c.ca_file)
        view = await api.call("GET", "cluster")
        urls = [n["admin_url"] for n in view["groups"]["broker-a"]["nodes"]]
        assert urls and all(u.startswith("https://") for u in urls), urls
        await api.close()
        plain = AdminApi(c.namesrv_url, credentials=c.admin)  # the system's CAs only
        with pytest.raises(AdminApiError) as err:
            await plain.call("GET", "cluster")
        assert err.value.status == 0 and "certificate" in str(err.value).lower()
        await plain.close()
        cleartext = AdminApi(c.namesrv_url.replace("https://", "http://"),
                             credentials=c.admin)
        with pytest.raises(AdminApiError):
            await cleartext.call("GET", "cluster")
        await cleartext.close()

    run(main())


def test_message_bodies_over_http_need_the_same_grant_as_on_the_wire(
        secure_cluster: SecureOpsCluster) -> None:
    """A user may read a topic's messages through the admin API only with SUB
    on it, as on the wire: the HTTP API is no way around the ACL."""
    from ledgermq.base.codes import RequestCode
    from ledgermq.wire import RpcClient
    from ledgermq.wire.tls import client_context

    c = secure_cluster

    async def main() -> None:
        leader = await wait_leader(c)
        await wait_group_ready(c)
        api = AdminApi(c.namesrv_url, credentials=c.admin, ca_file=c.ca_file)
        await api.call("POST", "topics", {"topic": "GrantT", "queues": 1})
        async with Producer([c.namesrv_address], **c.client_options()) as producer:
            sent = await producer.send("GrantT", b"secret-body", keys="k1")
        tls = client_context(c.ca_file) if c.ca_file else None
        host, port = c.client_address(leader).rsplit(":", 1)
        users = {"pub-only": {"GrantT": "PUB"}, "reader": {"GrantT": "SUB"}}
        async with await RpcClient.connect(host, int(port), credentials=c.admin,
                                           ssl=tls) as admin:
            for name, topics in users.items():
                await admin.request(RequestCode.ACL_PUT_USER, {
                    "access_key": name, "secret": name.encode() * 4, "topics": topics})
        leader_url = await c.admin_url(leader)
        by_id = f"{leader_url}/api/v1/messages/{sent.msg_id}"
        by_key = f"{leader_url}/api/v1/messages?topic=GrantT&key=k1"
        for url in (by_id, by_key):
            status, answer, _ = await signed(
                "GET", url, credentials=Credentials("pub-only", b"pub-only" * 4),
                ca_file=c.ca_file)
            assert (status, answer["error"]["code"]) == (403, "NO_PERMISSION"), answer
            assert "secret-body" not in str(answer)
            status, answer, _ = await signed(
                "GET", url, credentials=Credentials("reader", b"reader" * 4), ca_file=c.ca_file)
            assert status == 200 and "secret-body" in str(answer), answer
        await api.close()

    run(main())
