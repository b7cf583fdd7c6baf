"""Rolling restart (ledgermq/cli/rolling.py, `ledgermq cluster roll`) on real
local clusters: every node restarted once, followers first, the leader last
after a leadership transfer, each caught up before the next; no acknowledged
message lost under load; the availability gap of each step measured; a
group with a node down is not rolled. Waits poll with deadlines; nothing
asserts on elapsed time beyond generous bounds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.ports import free_port
from ledgermq.base.processes import cmdline_of
from ledgermq.broker.launcher import (
    REPO,
    LocalCluster,
    node_status,
    read_manifest,
    wait_leader,
)
from ledgermq.cli.rolling import (
    GroupWatch,
    admin_transfer,
    cluster_targets,
    roll,
    roll_order,
)
from ledgermq.client import Producer, PullConsumer

from .conftest import ledgermq

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SETTINGS = {"segment_size_bytes": 4 << 20}


def _statuses(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    async def all_of() -> dict[int, dict[str, Any]]:
        found = {}
        for nid in cluster.peers:
            status = await node_status(cluster.client_address(nid),
                                       credentials=cluster.credentials)
            assert status is not None, f"n{nid} does not answer"
            found[nid] = status
        return found

    return loop.run(all_of())


class Load:
    """Sends numbered messages from a thread of its own until stopped; what
    was acknowledged."""

    def __init__(self, cluster: LocalCluster, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        self.acked: set[bytes] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        producer = Producer([self.cluster.namesrv_address],
                            credentials=self.cluster.admin_credentials)
        try:
            i = 0
            while not self._stop.is_set():
                bodies = [b"m-%06d" % n for n in range(i, i + 8)]
                i += 8
                results = await asyncio.gather(*(producer.send(self.topic, b) for b in bodies),
                                               return_exceptions=True)
                for body, result in zip(bodies, results, strict=True):
                    if isinstance(result, BaseException):
                        self.failed += 1
                    else:
                        self.acked.add(body)
                await asyncio.sleep(0.01)
        finally:
            await producer.close()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


async def _read_all(cluster: LocalCluster, topic: str) -> set[bytes]:
    consumer = PullConsumer([cluster.namesrv_address], "roll-check",
                            credentials=cluster.admin_credentials)
    got: set[bytes] = set()
    try:
        for queue in await consumer.queues(topic, refresh=True):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, 256)
                if not result.messages:
                    break
                got.update(m.body for m in result.messages)
                offset = result.next_offset
    finally:
        await consumer.close()
    return got


def test_a_rolling_restart_under_load_restarts_every_node_once_and_loses_nothing(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=3, settings=SETTINGS, admin_listen="127.0.0.1:0",
                      secure=True) as cluster:
        leader = loop.run(wait_leader(cluster))
        before = _statuses(cluster)
        pids = {nid: child.proc.pid for nid, child in cluster.brokers.items()}
        order = roll_order(leader, sorted(cluster.peers))
        assert order[-1] == leader and len(order) == 3
        addresses = {nid: cluster.client_address(nid) for nid in cluster.peers}
        with Load(cluster, "rolled") as load, \
                GroupWatch(addresses, credentials=cluster.credentials) as watch:
            watch.wait_for("first sends", lambda s: len(load.acked) >= 50, 30)
            steps = roll(cluster_targets(cluster, order), watch,
                         admin_transfer(cluster.admin_credentials))
            sent_during = len(load.acked)
            watch.wait_for("more sends after the roll", lambda s: len(load.acked)
                           >= sent_during + 50, 30)
        assert [s.node_id for s in steps] == order
        # Every node was restarted once: new processes, same data directories.
        assert all(cluster.brokers[nid].proc.pid != pids[nid] for nid in pids)
        after = _statuses(cluster)
        for nid in cluster.peers:
            assert after[nid]["identity"]["how"] == "existing"
            assert after[nid]["identity"]["directory_id"] == \
                before[nid]["identity"]["directory_id"]
        # Followers first, untouched leadership; then the leader, handed over.
        assert not any(s.was_leader or s.transferred_to for s in steps[:-1])
        last = steps[-1]
        assert last.was_leader and last.transferred_to in order[:-1] and not last.notes
        for step in steps:
            assert step.caught_up_to > 0 and step.total_s > 0
            assert 0 <= step.longest_gap_s <= step.unavailable_s + 1e-9 <= step.total_s
        # The leader's step loses writes for about a transfer, not an election
        # plus a restart (generous bound: a loaded machine).
        assert last.unavailable_s < 5.0
        got = loop.run(_read_all(cluster, "rolled"))
        assert load.acked <= got, f"{len(load.acked - got)} acknowledged messages lost"
        assert len(load.acked) > sent_during >= 50


def test_cluster_roll_restarts_the_nodes_of_a_cluster_another_process_runs(
        tmp_path: Path) -> None:
    base = tmp_path / "dev"
    with LocalCluster(base, nodes=3, settings=SETTINGS, admin_listen="127.0.0.1:0") as cluster:
        leader = loop.run(wait_leader(cluster))
        before = read_manifest(base)["nodes"]
        done = ledgermq("cluster", "roll", "--dir", str(base), "-o", "json", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        steps = json.loads(done.stdout)["steps"]
        assert [s["node_id"] for s in steps][-1] == leader and len(steps) == 3
        # The leader goes last and hands leadership over first; on a starved
        # machine an election may move leadership during the followers' steps,
        # and then the last node was no longer the leader when its turn came.
        last_step = steps[-1]
        assert not last_step["was_leader"] or last_step["transferred_to"] not in (None, leader)
        after = read_manifest(base)["nodes"]
        new_pids = {nid: entry["pid"] for nid, entry in after.items()}
        assert all(new_pids[nid] != before[nid]["pid"] for nid in before)
        # The new processes run detached, the same command; the cluster knows them.
        replaced = cluster.replacements()
        assert sorted(replaced) == [1, 2, 3]
        assert all(p.pid == new_pids[str(n)] and p.alive for n, p in replaced.items())
        assert sorted(cluster.alive()) == [1, 2, 3]
        assert loop.run(wait_leader(cluster)) in (1, 2, 3)
        # The table output of a second roll names each step and its gap.
        table = ledgermq("cluster", "roll", "--dir", str(base), "--nodes", "n2", timeout=240)
        assert table.returncode == 0, table.stderr
        assert "n2" in table.stdout and "writes unavailable" in table.stdout
        assert "Done: 1 nodes restarted" in table.stdout
        last = cluster.replacements()
    # Stopping the cluster stops what the rolls started too.
    # (Exited: gone, or a zombie until whoever adopted it reaps it.)
    assert all(cmdline_of(p.pid) is None for p in last.values())


def test_cluster_roll_refuses_a_group_with_a_node_down(tmp_path: Path) -> None:
    base = tmp_path / "dev"
    with LocalCluster(base, nodes=3, settings=SETTINGS) as cluster:
        leader = loop.run(wait_leader(cluster))
        down = next(n for n in cluster.peers if n != leader)
        cluster.kill(down, signal.SIGKILL)
        pids = {n: c.proc.pid for n, c in cluster.brokers.items() if n != down}
        done = ledgermq("cluster", "roll", "--dir", str(base), "--settle-timeout", "3",
                        timeout=240)
        assert done.returncode == 1
        error = done.stderr.strip()
        assert error.startswith("error: before restarting n") and f"n{down}" in error
        assert "without a majority" in error and len(error.splitlines()) == 1
        assert {n: c.proc.pid for n, c in cluster.brokers.items() if n != down} == pids
        assert all(cluster.brokers[n].alive for n in pids)
    missing = ledgermq("cluster", "roll", "--dir", str(tmp_path / "none"))
    assert missing.returncode == 1 and "cluster.json not found" in missing.stderr


def test_rolling_a_ledgermq_dev_cluster_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    """The operator's path: `ledgermq dev` in one terminal, `ledgermq cluster
    roll` in another; dev keeps watching the restarted nodes and stops them
    on Ctrl-C."""
    base = tmp_path / "dev"
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    dev = subprocess.Popen(
        [sys.executable, "-m", "ledgermq.cli", "dev", "--dir", str(base), "--namesrv",
         f"127.0.0.1:{free_port()}", "--admin", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert dev.stdout is not None
        for line in dev.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(90) and dev.poll() is None, "".join(lines)
        first = {n: e["pid"] for n, e in read_manifest(base)["nodes"].items()}
        done = ledgermq("cluster", "roll", "--dir", str(base), timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("caught up to index") == 3
        # The node leading when its turn comes hands over first. Usually that
        # is the leader the roll began with (rolled last); on a busy host an
        # election may have moved leadership to a node already rolled, and
        # then no step needs a transfer.
        leader_steps = [line for line in done.stdout.splitlines() if " (leader): " in line]
        assert all("leadership to n" in line for line in leader_steps), done.stdout
        rolled = {n: e["pid"] for n, e in read_manifest(base)["nodes"].items()}
        assert all(rolled[n] != first[n] for n in first)
        assert dev.poll() is None, "".join(lines)
    finally:
        if dev.poll() is None:
            os.kill(dev.pid, signal.SIGINT)
        dev.wait(60)
    assert dev.returncode == 0, "".join(lines)
    deadline = time.monotonic() + 30
    while any(cmdline_of(pid) is not None for pid in rolled.values()):
        assert time.monotonic() < deadline, f"restarted nodes still running: {rolled}"
        time.sleep(0.05)
