"""Writes through the admin API from the CLI: `group reset` to an explicit
offset, of one queue or all, with `--dry-run` changing nothing; `leader
transfer` handing the group's leadership to another node."""

from __future__ import annotations

import json
import re
import time

import pytest
from ops.support import TOKEN, OpsCluster

from ledgermq.base import loop
from ledgermq.client import Producer
from tests.ledgermq.cli.conftest import ledgermq

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def committed(admin: str, group: str) -> dict[int, int]:
    result = ledgermq("group", "describe", group, "--admin", admin, "-o", "json")
    assert result.returncode == 0, result.stderr
    return {q["queue_id"]: q["offset"] for q in json.loads(result.stdout)["topics"]["CliReset"]}


def test_group_reset_offset_and_dry_run(cluster: OpsCluster) -> None:
    admin = ("--admin", cluster.namesrv_url)
    write = (*admin, "--token", TOKEN)

    async def send() -> None:
        async with Producer([cluster.namesrv_address]) as producer:
            await producer.create_topic("CliReset", queues=2)
            for i in range(8):
                await producer.send("CliReset", b"r%d" % i)

    loop.run(send())
    consumed = ledgermq("consume", "CliReset", "--group", "cli-reset", "--count", "8",
                        "--namesrv", cluster.namesrv_address)
    assert consumed.returncode == 0, consumed.stderr
    deadline = time.monotonic() + 30
    while committed(cluster.namesrv_url, "cli-reset") != {0: 4, 1: 4}:
        assert time.monotonic() < deadline, committed(cluster.namesrv_url, "cli-reset")
        time.sleep(0.2)

    dry = ledgermq("group", "reset", "cli-reset", "--topic", "CliReset", "--offset", "1",
                   "--dry-run", *write)
    assert dry.returncode == 0, dry.stderr
    assert "q0=1 (was 4), q1=1 (was 4)" in dry.stdout and "nothing changed" in dry.stdout
    time.sleep(1)  # a reset that was submitted would be applied by now
    assert committed(cluster.namesrv_url, "cli-reset") == {0: 4, 1: 4}

    one = ledgermq("group", "reset", "cli-reset", "--topic", "CliReset", "--offset", "1",
                   "--queue", "1", *write)
    assert one.returncode == 0 and "q1=1 (was 4)" in one.stdout and "q0" not in one.stdout
    assert committed(cluster.namesrv_url, "cli-reset") == {0: 4, 1: 1}

    # Beyond the queue's end: clamped to it (4 messages per queue).
    every = ledgermq("group", "reset", "cli-reset", "--topic", "CliReset", "--offset", "99",
                     *write)
    assert every.returncode == 0 and "q0=4 (was 4), q1=4 (was 1)" in every.stdout, every.stdout
    assert committed(cluster.namesrv_url, "cli-reset") == {0: 4, 1: 4}

    by_time = ledgermq("group", "reset", "cli-reset", "--topic", "CliReset", "--timestamp-ms",
                       "0", "--dry-run", *write)
    assert by_time.returncode == 0 and "q0=0 (was 4)" in by_time.stdout
    assert committed(cluster.namesrv_url, "cli-reset") == {0: 4, 1: 4}


def test_leader_transfer(cluster: OpsCluster) -> None:
    admin = ("--admin", cluster.namesrv_url)

    def leader() -> str | None:
        result = ledgermq("status", *admin, "-o", "json")
        assert result.returncode == 0, result.stderr
        group = json.loads(result.stdout)["groups"]["broker-a"]
        return group.get("leader") if group.get("leader_admin_url") else None

    deadline = time.monotonic() + 30
    while (old := leader()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    target = next(n for n in ("n1", "n2", "n3") if n != old)
    moved = ledgermq("leader", "transfer", "--to", target, "--token", TOKEN, *admin)
    assert moved.returncode == 0, moved.stderr
    assert f"leader is now {target}" in moved.stdout
    deadline = time.monotonic() + 30
    while leader() != target:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    bad = ledgermq("leader", "transfer", "--to", "n9", "--token", TOKEN, *admin)
    assert bad.returncode == 1 and re.search(r"error: 400 .*node 9", bad.stderr), bad.stderr
