"""Retention on a three-node group of real processes: every replica deletes
the segments below the agreed trim point once its own snapshot covers them,
the replicas' remaining files are byte-identical over the range they share,
a consumer whose offset was deleted continues from the oldest retained
message, and an operator's `ledgermq retention trim` moves the point for the
whole group."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from ops.support import TOKEN, OpsCluster, until
from typer.testing import CliRunner

from ledgermq.base import loop
from ledgermq.broker.launcher import node_status, wait_leader
from ledgermq.cli import app
from ledgermq.client import Producer, PullConsumer, PushConsumer
from ledgermq.client.admin import AdminApi
from ledgermq.client.model import MessageQueue

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SEGMENT = 64 * 1024
SETTINGS = {"segment_size_bytes": SEGMENT, "retention_bytes": 4 * SEGMENT,
            "retention_interval_ms": 200, "snapshot_interval_entries": 40,
            # Whatever this machine's disk holds, only the size rule deletes.
            "disk_soft_ratio": 1.0, "disk_hard_ratio": 1.0}


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def cli(*args: str) -> tuple[int, str]:
    """The command runs its own event loop: on a thread, off this one."""
    return await asyncio.to_thread(run_cli, *args)


def segment_files(data_dir: Path) -> dict[int, bytes]:
    """Base -> bytes of a replica's segments (one retention may delete
    meanwhile is left out)."""
    directory = data_dir / "commitlog"
    out = {}
    for name in os.listdir(directory):
        if name.isdigit():
            try:
                out[int(name)] = (directory / name).read_bytes()
            except FileNotFoundError:
                continue
    return out


def assert_identical_where_shared(cluster: OpsCluster) -> tuple[int, int]:
    """Every segment all replicas hold is the same bytes on each; the shared
    range (first, end) in positions."""
    files = {nid: segment_files(cluster.base / f"n{nid}") for nid in cluster.peers}
    shared = sorted(set.intersection(*(set(f) for f in files.values())))
    assert shared, f"no segment common to every replica: {[sorted(f) for f in files.values()]}"
    for base in shared:
        contents = [files[nid][base] for nid in sorted(files)]
        assert len(set(contents)) == 1, f"segment {base} differs between replicas"
    for nid, f in files.items():
        bases = sorted(f)
        # Each replica's segments are contiguous from its first one.
        assert bases == list(range(bases[0], bases[-1] + SEGMENT, SEGMENT)), (nid, bases)
    return shared[0], shared[-1] + len(files[1][shared[-1]])


async def retention_view(api: AdminApi) -> list[dict[str, Any]]:
    answer = await api.call("GET", "retention")
    return [n for g in answer["groups"].values() for n in g["nodes"]]


async def quiet(cluster: OpsCluster) -> None:
    """Until every replica has applied the same last entry."""
    async def same() -> bool:
        statuses = [await node_status(cluster.client_address(n)) for n in cluster.peers]
        indexes = {(s or {}).get("applied_index") for s in statuses}
        lasts = {(s or {}).get("last_index") for s in statuses}
        return len(indexes) == 1 and len(lasts) == 1 and None not in indexes
    await until(same, 30, "the replicas to settle")
    await asyncio.sleep(0.5)
    await until(same, 30, "the replicas to settle")


def test_three_replicas_trim_together(tmp_path: Path) -> None:
    cluster = OpsCluster(tmp_path / "cluster")
    cluster.settings.update(SETTINGS)
    cluster.start()
    try:
        loop.run(scenario(cluster))
    finally:
        cluster.stop()


async def scenario(cluster: OpsCluster) -> None:
    await wait_leader(cluster)
    ns = cluster.namesrv_address
    body = b"." * 1000
    async with Producer([ns], retry_timeout=20.0) as producer:
        await producer.create_topic("R", queues=2)
        # A group that committed offset 0 before anything was deleted.
        committer = PullConsumer([ns], "slow")
        try:
            for q in (0, 1):
                await committer.commit(MessageQueue("R", cluster.group, q), 0)
        finally:
            await committer.close()
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                await producer.send("R", b"%06d" % i + body,
                                    queue=MessageQueue("R", cluster.group, i % 2))

        await asyncio.gather(*(one(i) for i in range(1200)))  # ~1.3 MB: ~20 segments

    async with AdminApi(cluster.namesrv_url) as api:
        # 1. Every replica deletes, by the size rule, once snapshots allow it.
        async def all_trimmed() -> list[dict[str, Any]] | None:
            nodes = await retention_view(api)
            done = len(nodes) == 3 and all(
                "error" not in n and n["retained"]["first_index"] > 1
                and n["disk"]["segments"] <= 7 for n in nodes)
            return nodes if done else None

        nodes = await until(all_trimmed, 60, "every replica to delete its oldest segments")
        assert all(n["deleted"]["segments"] >= 10 for n in nodes)
        await quiet(cluster)
        # Every replica applied the same log.trim entries: one agreed point.
        agreed = {n["trim"]["agreed_position"] for n in await retention_view(api)}
        assert len(agreed) == 1 and agreed.pop() > 0
        first, end = assert_identical_where_shared(cluster)
        assert first >= 10 * SEGMENT and end > first

        # 2. The consumer committed at 0 gets OFFSET_MOVED and continues from
        # the oldest retained message of each queue.
        got: dict[int, list[int]] = {0: [], 1: []}
        push = PushConsumer([ns], "slow", "R",
                            lambda m: got[m.queue_id].append(m.queue_offset), long_poll_ms=300)
        starts: dict[int, tuple[int, int]] = {}
        reader = PullConsumer([ns], "probe")
        try:
            for q in (0, 1):
                starts[q] = await reader.queue_range(MessageQueue("R", cluster.group, q))
        finally:
            await reader.close()
        await push.start()
        try:
            await until(_async(lambda: all(len(got[q]) >= starts[q][1] - starts[q][0]
                                           for q in (0, 1))), 30, "the slow group")
        finally:
            await push.stop()
        assert push.offsets_moved >= 2
        for q in (0, 1):
            lo, hi = starts[q]
            assert lo > 0 and got[q][0] >= lo and got[q] == list(range(got[q][0], hi))

        # 3. An operator's trim through the CLI, up to the last applied entry.
        status = await node_status(cluster.client_address(await wait_leader(cluster)))
        assert status is not None
        target = status["applied_index"]
        admin = ["--admin", cluster.namesrv_url]
        code, out = await cli("retention", "trim", "--index", str(target), "--dry-run", *admin)
        assert code == 1 and "TOKEN_REQUIRED" in out  # writes need the admin token
        code, out = await cli("retention", "trim", "--index", str(target), "--token", TOKEN, "-o",
                        "json", *admin)
        assert code == 0, out
        answer = json.loads(out)
        point = answer["position"]
        assert point > first and answer["trim"] == point and answer["group"] == cluster.group
        # More entries, so each replica's next snapshot passes the point.
        async with Producer([ns], retry_timeout=20.0) as producer:
            for i in range(120):
                await producer.send("R", b"late-%d" % i)

        async def at_point() -> list[dict[str, Any]] | None:
            nodes = await retention_view(api)
            ok = all("error" not in n and n["retained"]["first_position"] == point
                     for n in nodes)
            return nodes if ok else None

        nodes = await until(at_point, 60, "every replica to delete up to the manual point")
        assert all(n["trim"]["agreed_position"] >= point for n in nodes)
        await quiet(cluster)
        first2, _ = assert_identical_where_shared(cluster)
        assert first2 == point

        code, out = await cli("retention", "show", *admin)
        assert code == 0, out
        assert out.count(cluster.group) >= 3 and "ok" in out and "retention_hours=72" in out
        code, out = await cli("retention", "show", "-o", "json", *admin)
        shown = json.loads(out)["groups"][cluster.group]["nodes"]
        assert sorted(n["node_id"] for n in shown) == ["n1", "n2", "n3"]


def _async(predicate):
    async def call():
        return predicate()
    return call
