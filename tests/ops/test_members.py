"""Membership changes as an operator makes them: `ledgermq member ...` and
`ledgermq node repair` run as subprocesses against a real 5-node deployment
(3 voters, 2 spares) through the NameServer's admin app, with messages sent
before and after every change and read back at the end; bad requests get a
JSON error with a fitting status and change nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ops.support import TOKEN, OpsCluster, http

from ledgermq.base import loop
from ledgermq.broker.launcher import REPO, node_status
from ledgermq.client import Producer, PullConsumer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TOPIC = "members"
# `ledgermq ...` (the arguments after the first) run once the file named by
# the first argument exists; `<file>.ready` says the imports are done.
CLI_ON_SIGNAL = """
import sys, time
from pathlib import Path
from ledgermq.cli import main
import ledgermq.cli.commands.member, ledgermq.webadmin.app
go = Path(sys.argv[1])
Path(str(go) + ".ready").touch()
while not go.exists():
    time.sleep(0.01)
sys.argv = ["ledgermq", *sys.argv[2:]]
main()
"""


def ledgermq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def member(cluster: OpsCluster, *args: str) -> subprocess.CompletedProcess[str]:
    done = ledgermq("member", *args, "--admin", cluster.namesrv_url, "--token", TOKEN)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a predicate (each call runs the CLI) until truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (AssertionError, KeyError):
            value = None  # e.g. no leader yet: the CLI fails
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def cli_once_stopped(tmp_path: Path, cluster: OpsCluster, pids: list[int],
                     *args: str) -> subprocess.Popen[str]:
    """`ledgermq member ...` (`args`, against the cluster's NameServer) in a
    process that starts and imports first, then runs the command right after
    the brokers `pids` are stopped (SIGSTOP; the caller resumes them): on a
    loaded machine the CLI's start-up alone can outlast the election timeout
    a leader keeps leading for without followers."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    go = tmp_path / "go"
    cli = subprocess.Popen(
        [sys.executable, "-c", CLI_ON_SIGNAL, str(go), "member", *args,
         "--admin", cluster.namesrv_url, "--token", TOKEN],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    wait(lambda: (tmp_path / "go.ready").exists() or cli.poll() is not None, 60,
         "the CLI's process ready")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    go.touch()
    return cli


def cli_while_quorum_lost(tmp_path: Path, cluster: OpsCluster, leader: int, stays: int,
                          back: int, *args: str) -> tuple[int, str]:
    """`ledgermq member ...` (`args`) run once the followers `stays` and
    `back` are stopped, so that the leader appends the change and cannot
    commit it; once the leader stepped down with the entry pending, `back`
    alone is resumed. The CLI's exit status and output."""
    pids = {n: cluster.brokers[n].proc.pid for n in (stays, back)}
    stopped = list(pids.values())
    try:
        cli = cli_once_stopped(tmp_path, cluster, stopped, *args)

        def stepped_down_with_the_entry() -> bool:
            status = loop.run(node_status(cluster.peers[leader].client))
            return (bool(status) and status["role"] != "leader"
                    and status["last_index"] > status["commit_index"])

        wait(stepped_down_with_the_entry, 30, "the leader stepped down, the change pending")
        os.kill(pids[back], signal.SIGCONT)
        stopped.remove(pids[back])
        out, _ = cli.communicate(timeout=120)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    return cli.returncode, out


def view(cluster: OpsCluster) -> dict[str, Any]:
    done = member(cluster, "list", "--json")
    groups = json.loads(done.stdout)["groups"]
    return dict(groups[cluster.group])


async def send(cluster: OpsCluster, bodies: list[bytes]) -> None:
    producer = Producer([cluster.namesrv_address], retry_timeout=30.0)
    try:
        for body in bodies:
            await producer.send(TOPIC, body)
    finally:
        await producer.close()


async def read_all(cluster: OpsCluster) -> list[bytes]:
    consumer = PullConsumer([cluster.namesrv_address], "members-check")
    got: list[bytes] = []
    try:
        for queue in await consumer.queues(TOPIC, refresh=True):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, 256)
                if not result.messages:
                    break
                got += [m.body for m in result.messages]
                offset = result.next_offset
    finally:
        await consumer.close()
    return got


def test_grow_replace_remove_the_leader_and_repair_a_wiped_node(tmp_path: Path) -> None:
    cluster = OpsCluster(tmp_path / "c", nodes=5)
    cluster.settings["initial_members"] = [1, 2, 3]
    cluster.settings["flush"] = "sync"
    with cluster:  # starts it
        url = cluster.namesrv_url
        wait(lambda: view(cluster).get("leader_id"), 30, "a leader")
        first = view(cluster)
        assert first["voters"] == [1, 2, 3] and first["learners"] == []
        loop.run(send(cluster, [b"a-%03d" % i for i in range(40)]))

        # Grow: n4 joins as a learner and is promoted once caught up.
        spare = cluster.peers[4]
        done = member(cluster, "add", "--node", "n4", "--address", spare.raft,
                      "--client-address", spare.client)
        assert "add_learner n4" in done.stdout and "promote n4" in done.stdout
        assert view(cluster)["voters"] == [1, 2, 3, 4]

        # Replace a follower by n5: add, promote, remove; never fewer voters.
        leader = view(cluster)["leader_id"]
        old = next(n for n in (1, 2, 3) if n != leader)
        new = cluster.peers[5]
        done = member(cluster, "replace", "--old", f"n{old}", "--new", "n5",
                      "--address", new.raft, "--client-address", new.client)
        assert [line.split()[0] for line in done.stdout.splitlines()[:3]] == \
            ["add_learner", "promote", "remove"]
        assert view(cluster)["voters"] == sorted({1, 2, 3, 4, 5} - {old})
        loop.run(send(cluster, [b"b-%03d" % i for i in range(40)]))

        # Remove the leader: it hands leadership over first; the CLI retries
        # on the new leader.
        leader = view(cluster)["leader_id"]
        member(cluster, "remove", "--node", str(leader))
        after = view(cluster)
        assert leader not in after["voters"] and after["leader_id"] != leader
        assert len(after["voters"]) == 3 and after["fault_tolerance"] == 1
        # The NameServer's routes carry the configuration; removed nodes are
        # not offered to clients.
        status, routes = loop.run(http("GET", f"{url}/api/v1/cluster", token=TOKEN))
        assert status == 200
        assert routes["groups"][cluster.group]["membership"]["voters"] == after["voters"]

        # Bad requests: a JSON error, nothing changed.
        changes = f"{url}/api/v1/members"
        g = cluster.group
        for path, body, code in [
            ("bogus", {"group": g, "node_id": 4}, 400),
            ("add", {"group": g, "node_id": 2**63, "address": "127.0.0.1:1"}, 400),
            ("add", {"group": g, "node_id": "4", "address": "127.0.0.1:1"}, 400),
            ("add", {"group": g, "node_id": 9, "address": "nohost"}, 400),
            ("add", {"group": g, "node_id": 9, "address": "127.0.0.1:1", "timeout": 1e9}, 400),
            ("add", {"group": g, "node_id": after["voters"][0], "address": "127.0.0.1:1"},
             400),
            ("remove", {"group": g, "node_id": 77}, 400),
            ("rejoin", {"group": g, "node_id": 77, "directory_id": -1}, 400),
            ("promote", {"group": g, "node_id": after["voters"][0]}, 400),
        ]:
            status, answer = loop.run(http("POST", f"{changes}/{path}", body, token=TOKEN))
            assert status == code, (path, body, status, answer)
            assert answer["error"]["message"], answer
        assert view(cluster)["voters"] == after["voters"]

        # Wipe a follower's disk: repaired (the damaged directory set aside),
        # restarted, it cannot vote until it rejoins; then it is a voter again.
        leader = after["leader_id"]
        victim = next(n for n in after["voters"] if n != leader)
        cluster.kill(victim)
        data_dir = tmp_path / "c" / f"n{victim}"
        repaired = ledgermq("node", "repair", "--data-dir", str(data_dir))
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        aside = [p for p in data_dir.parent.iterdir() if p.name.startswith(f"n{victim}.damaged-")]
        assert len(aside) == 1 and any(aside[0].iterdir())  # kept for inspection
        cluster.start_node(victim)

        def mismatch() -> bool:
            rows = {m["node_id"]: m for m in view(cluster)["members"]}
            return bool(rows[victim].get("identity_mismatch"))

        wait(mismatch, 30, "the leader sees the repaired node's new directory")
        done = member(cluster, "rejoin", "--node", str(victim))
        assert "rejoin" in done.stdout and "promote" in done.stdout
        final = view(cluster)
        rows = {m["node_id"]: m for m in final["members"]}
        assert final["voters"] == after["voters"] and not rows[victim]["identity_mismatch"]

        loop.run(send(cluster, [b"c-%03d" % i for i in range(40)]))
        got = loop.run(read_all(cluster))
        expected = {b"%s-%03d" % (p, i) for p in (b"a", b"b", b"c") for i in range(40)}
        assert set(got) == expected and len(got) == len(expected)


def test_a_change_whose_term_ends_before_it_commits_is_retried_by_the_cli(
        tmp_path: Path) -> None:
    """`member add` while the leader cannot commit (its followers stopped
    with SIGSTOP): it steps down, the followers come back and elect in a
    later term, and the leader answers the add 503 OUTCOME_UNKNOWN (it was an
    internal error before). The CLI says so and retries on the new leader,
    where the add, resumable, finishes."""
    cluster = OpsCluster(tmp_path / "c", nodes=4)
    cluster.settings["initial_members"] = [1, 2, 3]
    # A leader without its followers keeps leading for an election timeout (4 s).
    cluster.raft = {"tick_ms": 100, "election_timeout_ticks": 40, "heartbeat_interval_ticks": 1}
    with cluster:
        leader = wait(lambda: view(cluster).get("leader_id"), 30, "a leader")
        followers = [cluster.brokers[n].proc.pid for n in (1, 2, 3) if n != leader]
        spare = cluster.peers[4]
        try:
            adding = cli_once_stopped(
                tmp_path, cluster, followers, "add", "--node", "n4", "--address", spare.raft,
                "--client-address", spare.client, "--timeout", "30")

            def appended() -> bool:  # the add's CONFIG entry, which cannot commit
                status = loop.run(node_status(cluster.peers[leader].client))
                return bool(status) and status["last_index"] > status["commit_index"]

            wait(appended, 30, "the add's entry appended on the leader")

            def stepped_down() -> bool:  # check-quorum, after an election timeout
                status = loop.run(node_status(cluster.peers[leader].client))
                return bool(status) and status["role"] != "leader"

            wait(stepped_down, 30, "the leader stepped down without a quorum")
        finally:
            for pid in followers:
                os.kill(pid, signal.SIGCONT)
        out, _ = adding.communicate(timeout=120)
        assert adding.returncode == 0, out
        assert "add_learner n4: leadership changed before its configuration entry" in out, out
        assert "retry the operation" in out
        wait(lambda: view(cluster)["voters"] == [1, 2, 3, 4], 30, "n4 a voter")
        loop.run(send(cluster, [b"after-%d" % i for i in range(10)]))
        assert sorted(loop.run(read_all(cluster))) == [b"after-%d" % i for i in range(10)]


def test_a_remove_whose_outcome_was_unknown_is_found_done_by_the_cli(tmp_path: Path) -> None:
    """`member remove` of a follower while both followers are stopped: the
    leader appends the change, cannot commit it, steps down, and answers 503
    OUTCOME_UNKNOWN. Only the other follower comes back, so only the old
    leader, whose log holds the change, can win, and it commits the removal.
    The broker refuses to remove a node that is no longer a member, so the
    CLI looks at the leader's committed configuration before it retries and
    finds the removal done (before, it gave up on OUTCOME_UNKNOWN)."""
    cluster = OpsCluster(tmp_path / "c", nodes=3)
    cluster.raft = {"tick_ms": 100, "election_timeout_ticks": 40, "heartbeat_interval_ticks": 1}
    with cluster:
        leader = wait(lambda: view(cluster).get("leader_id"), 30, "a leader")
        removed, other = [n for n in (1, 2, 3) if n != leader]
        status, out = cli_while_quorum_lost(tmp_path, cluster, leader, removed, other, "remove",
                                            "--node", str(removed), "--force", "--timeout", "60")
        assert status == 0, out
        assert f"remove n{removed}: leadership changed before its configuration entry" in out, out
        assert "the earlier remove committed: nothing left to do" in out, out
        final = view(cluster)
        assert final["voters"] == sorted([leader, other]) and final["leader_id"] == leader


def test_a_promote_whose_outcome_was_unknown_is_found_done_by_the_cli(tmp_path: Path) -> None:
    """`member promote` of a caught-up learner while both followers are
    stopped: the leader appends the change (n4 gets it too), cannot commit
    it, steps down and answers 503 OUTCOME_UNKNOWN. One follower comes back;
    whoever wins, the old leader or n4, holds the change and commits it. The
    broker refuses to promote a node that is no longer a learner, so the CLI
    looks at the leader's committed configuration before it retries and
    finds the promotion done (before, it gave up on OUTCOME_UNKNOWN)."""
    cluster = OpsCluster(tmp_path / "c", nodes=4)
    cluster.settings["initial_members"] = [1, 2, 3]
    cluster.raft = {"tick_ms": 100, "election_timeout_ticks": 40, "heartbeat_interval_ticks": 1}
    with cluster:
        leader = wait(lambda: view(cluster).get("leader_id"), 30, "a leader")
        spare = cluster.peers[4]
        member(cluster, "add", "--node", "n4", "--address", spare.raft,
               "--client-address", spare.client, "--learner")

        def a_settled_learner() -> bool:  # its directory pinned, nothing pending
            v = view(cluster)
            return v["learners"] == [4] and not v["membership_pending"]

        wait(a_settled_learner, 30, "n4 a learner, its directory pinned")
        leader = view(cluster)["leader_id"]
        stays, back = [n for n in (1, 2, 3) if n != leader]
        status, out = cli_while_quorum_lost(tmp_path, cluster, leader, stays, back, "promote",
                                            "--node", "n4", "--timeout", "60")
        assert status == 0, out
        assert "promote n4: leadership changed before its configuration entry" in out, out
        assert "the earlier promote committed: nothing left to do" in out, out
        wait(lambda: view(cluster)["voters"] == [1, 2, 3, 4], 30, "n4 a voter")
        loop.run(send(cluster, [b"after-%d" % i for i in range(10)]))
        assert sorted(loop.run(read_all(cluster))) == [b"after-%d" % i for i in range(10)]
