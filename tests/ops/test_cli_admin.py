"""`ledgermq status / topic / group` against the NameServer's admin API of a
running group (in-process Typer runner; the cluster is real processes)."""

from __future__ import annotations

import re

import pytest
from ops.support import TOKEN, OpsCluster
from typer.testing import CliRunner

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.cli import app
from ledgermq.client import Producer

pytestmark = [pytest.mark.timeout(120)]


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_status_topic_and_group_commands(ops_cluster: OpsCluster) -> None:
    admin = ["--admin", ops_cluster.namesrv_url]
    leader = loop.run(wait_leader(ops_cluster))
    code, out = cli("status", *admin)
    assert code == 0, out
    assert re.search(rf"leader n{leader}", out) and out.count("follower") >= 1
    code, out = cli("topic", "create", "CliOps", "--queues", "2", *admin)
    assert code == 1 and "401 TOKEN_REQUIRED" in out
    code, out = cli("topic", "create", "CliOps", "--queues", "2", "--token", TOKEN, *admin)
    assert code == 0 and "2 queues" in out, out
    code, out = cli("topic", "update", "CliOps", "--queues", "3", "--token", TOKEN, *admin)
    assert code == 0 and "3 queues" in out, out

    async def send() -> None:
        async with Producer([ops_cluster.namesrv_address]) as producer:
            for i in range(6):
                await producer.send("CliOps", b"m%d" % i)

    loop.run(send())
    code, out = cli("topic", "list", *admin)
    assert code == 0 and re.search(r"CliOps\s.*broker-a\s.*3\s.*6\s.*6", out), out
    code, out = cli("topic", "describe", "CliOps", *admin)
    assert code == 0 and "max offset" in out
    code, out = cli("topic", "describe", "NoSuch", *admin)
    assert code == 1 and "404 UNKNOWN_TOPIC" in out
    code, out = cli("group", "reset", "cli-cg", "--topic", "CliOps", "--timestamp-ms", "0",
                    "--token", TOKEN, *admin)
    assert code == 0 and "q0=0" in out, out
    code, out = cli("group", "list", *admin)
    assert code == 0 and re.search(r"cli-cg\s.*CliOps\s.*0\s.*6", out), out
    code, out = cli("group", "describe", "cli-cg", *admin)
    assert code == 0 and "lag 6" in out, out
    code, out = cli("group", "describe", "nobody", *admin)
    assert code == 1 and "404 UNKNOWN_GROUP" in out
    code, out = cli("topic", "delete", "CliOps", "--token", TOKEN, *admin)
    assert code == 0 and "deleted" in out
    code, out = cli("status", "--admin", "http://127.0.0.1:9")
    assert code == 1 and "UNREACHABLE" in out
