"""The read commands for scripts and for 80-column terminals: `-o json` is
one JSON document on stdout and nothing else; `status` keeps every address
and role whole at 80 columns. Also message lookups by id and key."""

from __future__ import annotations

import json
import re
import time

import pytest
from ops.support import TOKEN, OpsCluster

from tests.ledgermq.cli.conftest import ledgermq

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def as_json(*args: str) -> dict:
    result = ledgermq(*args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # fails on anything but one JSON document


def ready_view(admin: str) -> dict:
    """The cluster view once the group has a ready leader with its admin URL."""
    deadline = time.monotonic() + 30
    while True:
        view = as_json("status", "--admin", admin)
        group = view["groups"].get("broker-a", {})
        if group.get("leader") and group.get("leader_admin_url"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


@pytest.fixture(scope="module")
def sent(cluster: OpsCluster) -> list[str]:
    """Three messages of topic CliRead with key `order-7` (message ids)."""
    ready_view(cluster.namesrv_url)
    created = ledgermq("topic", "create", "CliRead", "--queues", "2", "--token", TOKEN,
                       "--admin", cluster.namesrv_url)
    assert created.returncode == 0, created.stderr
    result = ledgermq("send", "CliRead", "a", "b", "c", "--keys", "order-7 x",
                      "--namesrv", cluster.namesrv_address)
    assert result.returncode == 0, result.stderr
    return re.findall(r"broker-a@[0-9A-F]{16}", result.stdout)


def test_json_output_of_every_read_command(cluster: OpsCluster, sent: list[str]) -> None:
    admin = ("--admin", cluster.namesrv_url)
    view = as_json("status", *admin)
    assert {n["node_id"] for n in view["groups"]["broker-a"]["nodes"]} == {"n1", "n2", "n3"}
    wire = as_json("status", "--namesrv", cluster.namesrv_address)
    assert set(wire["groups"]) == {"broker-a"}
    topics = as_json("topic", "list", *admin)["topics"]
    assert any(t["topic"] == "CliRead" and t["messages"] == 3 for t in topics), topics
    assert any(t["topic"] == "CliRead"
               for t in as_json("topic", "list", "--namesrv", cluster.namesrv_address)["topics"])
    described = as_json("topic", "describe", "CliRead", *admin)
    assert described["topic"] == "CliRead"
    assert len(described["groups"]["broker-a"]["queue_offsets"]) == 2
    consumed = ledgermq("consume", "CliRead", "--group", "cli-json", "--count", "3",
                        "--namesrv", cluster.namesrv_address)
    assert consumed.returncode == 0, consumed.stderr
    deadline = time.monotonic() + 30
    while not any(g["group"] == "cli-json"
                  for g in as_json("group", "list", *admin)["consumer_groups"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    group = as_json("group", "describe", "cli-json", *admin)
    assert group["group"] == "cli-json" and "CliRead" in group["topics"]
    message = as_json("message", "get", sent[0], *admin)
    assert message["msg_id"] == sent[0] and message["body_text"] == "a"
    found = as_json("message", "find", "--topic", "CliRead", "--key", "order-7", *admin)
    assert sorted(m["msg_id"] for m in found["messages"]) == sorted(sent)


def test_message_get_and_find_tables(cluster: OpsCluster, sent: list[str]) -> None:
    admin = ("--admin", cluster.namesrv_url)
    got = ledgermq("message", "get", sent[1], *admin)
    assert got.returncode == 0, got.stderr
    assert re.search(r"body_text\s+b\b", got.stdout) and "order-7 x" in got.stdout
    assert re.search(r"topic\s+CliRead", got.stdout)
    found = ledgermq("message", "find", "--topic", "CliRead", "--key", "order-7", *admin)
    assert found.returncode == 0, found.stderr
    assert all(msg_id in found.stdout for msg_id in sent)
    assert "with key order-7: 3" in found.stdout
    none = ledgermq("message", "find", "--topic", "CliRead", "--key", "x-none", *admin)
    assert none.returncode == 0 and "with key x-none: 0" in none.stdout


def test_status_keeps_addresses_and_roles_whole_at_80_columns(cluster: OpsCluster) -> None:
    view = ready_view(cluster.namesrv_url)
    nodes = view["groups"]["broker-a"]["nodes"]
    for args in (("--admin", cluster.namesrv_url), ("--namesrv", cluster.namesrv_address)):
        result = ledgermq("status", *args, columns=80)
        assert result.returncode == 0, result.stderr
        assert max(len(line) for line in result.stdout.splitlines()) <= 80
        for node in nodes:
            row = next(line for line in result.stdout.splitlines()
                       if line.startswith(node["node_id"] + " "))
            assert node["address"] in row, result.stdout
            assert re.search(rf"\b{node['role']}\b", row), result.stdout
