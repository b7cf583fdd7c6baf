"""The HTTP admin API over real HTTP, on a running 3-node group: every
endpoint on the NameServer's app (which forwards) and on brokers' apps, with
bad input getting a JSON error and a fitting status."""

from __future__ import annotations

import time

import pytest
from ops.support import TOKEN, OpsCluster, http, until

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.client import Producer, PushConsumer

pytestmark = [pytest.mark.timeout(120)]


def error_code(answer: tuple[int, object]) -> str:
    status, body = answer
    assert isinstance(body, dict) and "error" in body, f"not a JSON error: {status} {body!r}"
    assert body["error"]["message"], body
    return body["error"]["code"]


def run(coro):
    return loop.run(coro)


def test_cluster_view_from_namesrv_and_brokers(ops_cluster: OpsCluster) -> None:
    async def main() -> None:
        leader = await wait_leader(ops_cluster)
        urls = {nid: await ops_cluster.admin_url(nid) for nid in ops_cluster.alive()}

        async def three_nodes_one_leader(url: str):
            status, body = await http("GET", f"{url}/api/v1/cluster")
            assert status == 200
            group = body["groups"]["broker-a"]
            roles = sorted(n.get("role") or "" for n in group["nodes"])
            return group if roles == ["follower", "follower", "leader"] else None

        for url in (ops_cluster.namesrv_url, urls[leader], urls[leader % 3 + 1]):
            group = await until(lambda u=url: three_nodes_one_leader(u), 15, f"view of {url}")
            assert group["leader"] == f"n{leader}"
            assert group["leader_admin_url"] == urls[leader]
            follower_lags = group["nodes"][leader - 1]["followers"]
            assert set(follower_lags) == {str(n) for n in (1, 2, 3) if n != leader}
        status, body = await http("GET", f"{urls[leader]}/api/v1/status")
        assert status == 200 and body["role"] == "leader" and body["node_id"] == leader
        assert body["node_status"]["followers"]
        status, body = await http("GET", f"{ops_cluster.namesrv_url}/api/v1/info")
        assert (status, body["kind"]) == (200, "namesrv")

    run(main())


def test_topics_crud_and_errors(ops_cluster: OpsCluster) -> None:
    ns = ops_cluster.namesrv_url

    async def main() -> None:
        leader = await wait_leader(ops_cluster)
        follower_url = await ops_cluster.admin_url(leader % 3 + 1)
        # Writes need the token: missing -> 401, wrong -> 403, on both apps.
        for url in (ns, follower_url):
            assert error_code(await http("POST", f"{url}/api/v1/topics",
                                         {"topic": "Orders"})) == "TOKEN_REQUIRED"
            answer = await http("POST", f"{url}/api/v1/topics", {"topic": "Orders"},
                                token="wrong")
            assert (answer[0], error_code(answer)) == (403, "TOKEN_INVALID")
        # Malformed JSON and bad fields -> 400.
        answer = await http("POST", f"{ns}/api/v1/topics", raw=b"{not json", token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_JSON")
        answer = await http("POST", f"{ns}/api/v1/topics", [1, 2], token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_JSON")
        # Nested deeper than the decoder's stack (found by the fuzzer: a 500).
        deep = b"[" * 200_000 + b"]" * 200_000
        for url in (ns, follower_url):
            answer = await http("POST", f"{url}/api/v1/topics", raw=deep, token=TOKEN)
            assert (answer[0], error_code(answer)) == (400, "INVALID_JSON")
        # A static name no file system can hold is not found (was a 500).
        status, _ = await http("GET", f"{follower_url}/static/{'a' * 300}")
        assert status == 404
        answer = await http("POST", f"{ns}/api/v1/topics", {"queues": 2}, token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("POST", f"{ns}/api/v1/topics", {"topic": "Orders", "queues": 0},
                            token=TOKEN)
        assert answer[0] == 400 and error_code(answer) == "INVALID_REQUEST"
        answer = await http("POST", f"{ns}/api/v1/topics", {"topic": "bad name!"},
                            token=TOKEN)
        assert answer[0] == 400 and error_code(answer) == "INVALID_REQUEST"
        # A follower's own app refuses writes and names the leader.
        answer = await http("POST", f"{follower_url}/api/v1/topics", {"topic": "Orders"},
                            token=TOKEN)
        assert (answer[0], error_code(answer)) == (409, "NOT_LEADER")
        assert answer[1]["error"]["data"]["leader_admin_url"] == \
            await ops_cluster.admin_url(leader)
        # Create through the NameServer, then every node serves it.
        status, body = await http("POST", f"{ns}/api/v1/topics",
                                  {"topic": "Orders", "queues": 2}, token=TOKEN)
        assert status == 201, body
        assert body["groups"]["broker-a"]["queues"] == 2

        async def everywhere() -> bool:
            for nid in ops_cluster.alive():
                url = await ops_cluster.admin_url(nid)
                status, body = await http("GET", f"{url}/api/v1/topics/Orders")
                if status != 200 or body["queues"] != 2:
                    return False
            return True

        await until(everywhere, 10, "the topic on every node")
        status, body = await http("GET", f"{ns}/api/v1/topics")
        assert status == 200 and "Orders" in [t["topic"] for t in body["topics"]]
        status, body = await http("GET", f"{ns}/api/v1/topics/Orders")
        assert status == 200 and len(body["groups"]["broker-a"]["queue_offsets"]) == 2
        # Update: grow to 3 queues, read-only; shrinking is refused.
        status, body = await http("PUT", f"{ns}/api/v1/topics/Orders",
                                  {"queues": 3, "perm": 4}, token=TOKEN)
        assert status == 200, body
        assert body["groups"]["broker-a"]["queues"] == 3
        assert body["groups"]["broker-a"]["perm"] == 4
        answer = await http("PUT", f"{ns}/api/v1/topics/Orders", {"queues": 1}, token=TOKEN)
        assert answer[0] == 400 and error_code(answer) == "INVALID_REQUEST"
        # Unknown topic -> 404 everywhere.
        for method, body in (("GET", None), ("PUT", {"queues": 2}), ("DELETE", None)):
            for url in (ns, follower_url):
                answer = await http(method, f"{url}/api/v1/topics/NoSuchTopic", body,
                                    token=TOKEN)
                assert (answer[0], error_code(answer)) == (404, "UNKNOWN_TOPIC"), \
                    (method, url, answer)
        status, body = await http("DELETE", f"{ns}/api/v1/topics/Orders", token=TOKEN)
        assert status == 200 and body["groups"]["broker-a"]["deleted"] is True
        answer = await http("GET", f"{ns}/api/v1/topics/Orders")
        assert answer[0] == 404
        # Routes that do not exist, or a wrong method, are JSON errors too.
        answer = await http("GET", f"{ns}/api/v1/nothing-here")
        assert (answer[0], error_code(answer)) == (404, "NOT_FOUND")
        answer = await http("PATCH", f"{ns}/api/v1/cluster", token=TOKEN)
        assert (answer[0], error_code(answer)) == (405, "METHOD_NOT_ALLOWED")

    run(main())


def test_messages_consumer_groups_and_offset_reset(ops_cluster: OpsCluster) -> None:
    ns = ops_cluster.namesrv_url

    async def main() -> None:
        await wait_leader(ops_cluster)
        status, _ = await http("POST", f"{ns}/api/v1/topics", {"topic": "Lookup", "queues": 2},
                               token=TOKEN)
        assert status == 201
        start_ms = int(time.time() * 1000)
        async with Producer([ops_cluster.namesrv_address]) as producer:
            sent = [await producer.send("Lookup", f"body-{i}".encode(), keys=f"order-{i} k",
                                        tags="t") for i in range(20)]
        # By id, on the NameServer and on a follower's own app.
        target = sent[7]
        follower = (await wait_leader(ops_cluster)) % 3 + 1
        follower_url = await ops_cluster.admin_url(follower)

        async def found_on(url: str):
            status, body = await http("GET", f"{url}/api/v1/messages/{target.msg_id}")
            return body if status == 200 else None

        for url in (ns, follower_url):
            body = await until(lambda u=url: found_on(u), 10, f"message on {url}")
            assert body["body_text"] == "body-7" and body["keys"] == "order-7 k"
            assert body["queue_offset"] == target.queue_offset
            assert body["msg_id"] == target.msg_id
        # Malformed and unknown ids.
        answer = await http("GET", f"{ns}/api/v1/messages/not-an-id")
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("GET", f"{follower_url}/api/v1/messages/broker-a@zz")
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("GET", f"{ns}/api/v1/messages/broker-a@00000000FFFFFF00")
        assert (answer[0], error_code(answer)) == (404, "NOT_FOUND")
        offset = int(target.msg_id.split("@")[1], 16)
        answer = await http("GET", f"{ns}/api/v1/messages/broker-a@{offset + 1:016X}")
        assert answer[0] == 404, "an offset inside a record is not a message id"
        answer = await http("GET", f"{ns}/api/v1/messages/other-group@{offset:016X}")
        assert (answer[0], error_code(answer)) == (404, "UNKNOWN_GROUP")
        # By key: exact key match among the space-separated keys.
        status, body = await http("GET", f"{ns}/api/v1/messages?topic=Lookup&key=order-13")
        assert status == 200 and [m["body_text"] for m in body["messages"]] == ["body-13"]
        assert body["complete"] is True and body["scanned"] == 20
        status, body = await http("GET", f"{ns}/api/v1/messages?topic=Lookup&key=k&limit=5")
        assert status == 200 and len(body["messages"]) == 5
        answer = await http("GET", f"{ns}/api/v1/messages?topic=Lookup")
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("GET", f"{ns}/api/v1/messages?topic=Nope&key=x")
        assert (answer[0], error_code(answer)) == (404, "UNKNOWN_TOPIC")
        answer = await http("GET", f"{follower_url}/api/v1/messages?topic=Lookup&key=x&limit=0")
        assert answer[0] == 400
        # A consumer group consumes everything: lag 0.
        got: set[bytes] = set()
        consumer = PushConsumer([ops_cluster.namesrv_address], "cg-ops", "Lookup",
                                lambda m: got.add(m.body), long_poll_ms=200)
        await consumer.start()
        try:
            async def consumed() -> bool:
                return len(got) == 20

            await until(consumed, 30, "20 messages consumed")

            async def caught_up():
                status, body = await http("GET", f"{ns}/api/v1/consumer-groups/cg-ops")
                if status != 200:
                    return None
                offsets = sum(q["offset"] for q in body["topics"].get("Lookup", []))
                return body if offsets == 20 else None

            body = await until(caught_up, 15, "committed offsets")
            assert body["lag"] == 0
        finally:
            await consumer.stop()
        status, body = await http("GET", f"{ns}/api/v1/consumer-groups")
        assert status == 200
        assert {"group": "cg-ops", "topics": ["Lookup"], "lag": 0} .items() <= \
            next(g for g in body["consumer_groups"] if g["group"] == "cg-ops").items()
        answer = await http("GET", f"{ns}/api/v1/consumer-groups/nobody")
        assert (answer[0], error_code(answer)) == (404, "UNKNOWN_GROUP")
        # Reset to before the first message: every offset back to 0, lag 20.
        for bad in ({"topic": "Lookup"}, {"timestamp_ms": 0}, {"topic": "Lookup",
                                                              "timestamp_ms": "x"}):
            answer = await http("POST", f"{ns}/api/v1/consumer-groups/cg-ops/reset-offsets",
                                bad, token=TOKEN)
            assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("POST", f"{ns}/api/v1/consumer-groups/cg-ops/reset-offsets",
                            {"topic": "Nope", "timestamp_ms": 0}, token=TOKEN)
        assert (answer[0], error_code(answer)) == (404, "UNKNOWN_TOPIC")
        answer = await http("POST", f"{ns}/api/v1/consumer-groups/cg-ops/reset-offsets",
                            {"topic": "Lookup", "timestamp_ms": 0})
        assert answer[0] == 401
        status, body = await http("POST", f"{ns}/api/v1/consumer-groups/cg-ops/reset-offsets",
                                  {"topic": "Lookup", "timestamp_ms": start_ms - 60_000},
                                  token=TOKEN)
        assert status == 200, body
        assert [q["offset"] for q in body["groups"]["broker-a"]["offsets"]] == [0, 0]

        async def lag_back():
            status, body = await http("GET", f"{follower_url}/api/v1/consumer-groups/cg-ops")
            return body if status == 200 and body["lag"] == 20 else None

        await until(lag_back, 10, "the reset replicated to a follower")
        # Reset to after the last message: offsets at the end of each queue.
        status, body = await http("POST", f"{ns}/api/v1/consumer-groups/cg-ops/reset-offsets",
                                  {"topic": "Lookup", "timestamp_ms": 2**62}, token=TOKEN)
        assert status == 200
        status, body = await http("GET", f"{ns}/api/v1/consumer-groups/cg-ops")
        assert body["lag"] == 0

    run(main())


def test_transfer_leadership(ops_cluster: OpsCluster) -> None:
    ns = ops_cluster.namesrv_url

    async def main() -> None:
        leader = await wait_leader(ops_cluster)
        target = leader % 3 + 1
        answer = await http("POST", f"{ns}/api/v1/leadership/transfer",
                            {"group": "broker-a", "to": 9}, token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("POST", f"{ns}/api/v1/leadership/transfer",
                            {"group": "nope", "to": target}, token=TOKEN)
        assert (answer[0], error_code(answer)) == (404, "UNKNOWN_GROUP")
        answer = await http("POST", f"{ns}/api/v1/leadership/transfer", {"group": "broker-a"},
                            token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        status, body = await http("POST", f"{ns}/api/v1/leadership/transfer",
                                  {"group": "broker-a", "to": target}, token=TOKEN)
        assert status == 200, body
        assert body["leader_id"] == target
        assert await wait_leader(ops_cluster) == target

    run(main())


def test_openapi_reports_and_dashboard_files(ops_cluster: OpsCluster) -> None:
    async def main() -> None:
        urls = [ops_cluster.namesrv_url, await ops_cluster.admin_url(1)]
        for url in urls:
            status, spec = await http("GET", f"{url}/openapi.json")
            assert status == 200 and spec["openapi"].startswith("3.")
            for path in ("/api/v1/cluster", "/api/v1/topics", "/api/v1/topics/{topic}",
                         "/api/v1/consumer-groups/{group}/reset-offsets",
                         "/api/v1/messages/{msg_id}", "/api/v1/leadership/transfer"):
                assert path in spec["paths"], (url, path)
            status, body = await http("GET", f"{url}/api/v1/reports")
            assert status == 200
            kinds = {r["path"]: r["kind"] for r in body["reports"]}
            assert kinds == {"chaos-2024-01-01T00-00-00/index.html": "chaos",
                             "audit-broker-a.json": "audit"}
            status, text = await http("GET", f"{url}/reports/chaos-2024-01-01T00-00-00/"
                                      "index.html")
            assert status == 200 and "chaos run" in text
            for bad in ("../n1.toml", "nope.html", "%2e%2e/%2e%2e/etc/passwd"):
                status, _ = await http("GET", f"{url}/reports/{bad}")
                assert status == 404, bad
            status, html = await http("GET", f"{url}/")
            assert status == 200 and "static/app.js" in html
            status, js = await http("GET", f"{url}/static/app.js")
            assert status == 200 and "api/v1" in js

    run(main())


def test_each_server_routes_exactly_the_operations_of_the_api_table(
        ops_cluster: OpsCluster) -> None:
    """One table (ledgermq.webadmin.openapi.OPERATIONS) makes both the OpenAPI
    document and every server's router: what /openapi.json lists is what answers."""
    from ledgermq.webadmin.openapi import operations

    async def body() -> None:
        broker_url = await ops_cluster.admin_url(sorted(ops_cluster.alive())[0])
        for kind, url in (("broker", broker_url), ("namesrv", ops_cluster.namesrv_url)):
            status, spec = await http("GET", f"{url}/openapi.json")
            assert status == 200
            listed = {(method, path) for path, ops in spec["paths"].items()
                      for method in ops if path.startswith("/api/")}
            assert listed == {(op.method, op.path) for op in operations(kind)}
            for path, ops in spec["paths"].items():
                for method, op in ops.items():
                    if path.startswith("/api/") and "{" not in path and method == "get":
                        # Routed: any answer but the router's own 404 (a documented
                        # 404 such as /api/v1/audit's NO_AUDIT is the operation's).
                        status, answer = await http("GET", f"{url}{path}")
                        error = answer.get("error") if isinstance(answer, dict) else None
                        assert status != 404 or (error or {}).get("code") != "NOT_FOUND", (
                            kind, path, op["operationId"])

    run(body())


def test_path_tricks_are_refused_before_forwarding(ops_cluster: OpsCluster) -> None:
    """Names in paths (and the topic of a reset) must be valid names: the
    NameServer used to forward `..%2F..%2Fx` into a broker's path."""
    ns = ops_cluster.namesrv_url
    trick = "..%2F..%2Fx"

    async def main() -> None:
        leader = await wait_leader(ops_cluster)
        broker = await ops_cluster.admin_url(leader)
        cases = [("GET", f"topics/{trick}", None), ("PUT", f"topics/{trick}", {"queues": 2}),
                 ("DELETE", f"topics/{trick}", None), ("GET", f"consumer-groups/{trick}", None),
                 ("POST", f"consumer-groups/{trick}/reset-offsets",
                  {"topic": "Orders", "offset": 0}),
                 ("GET", f"messages/{trick}@0000000000000000", None),
                 ("GET", "messages/broker-a@..%2F..%2F0000000000", None),
                 ("GET", f"topics/{'a' * 200}", None)]
        for base in (ns, broker):
            for method, path, body in cases:
                answer = await http(method, f"{base}/api/v1/{path}", body, token=TOKEN)
                assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST"), \
                    (base, method, path, answer)
        answer = await http("POST", f"{ns}/api/v1/consumer-groups/cg/reset-offsets",
                            {"topic": "../../x", "offset": 0}, token=TOKEN)
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")
        answer = await http("GET", f"{ns}/api/v1/messages?topic={trick}&key=k")
        assert (answer[0], error_code(answer)) == (400, "INVALID_REQUEST")

    run(main())
