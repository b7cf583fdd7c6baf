"""Capturing the live cut (ledgermq/cli/audit_cut.py) from running brokers.

Against the folder's real cluster (a NameServer and three brokers with their
admin apps, conftest.py): the cut taken while a producer writes is the
group's commit index at that moment (between the leader's commit before and
after), chosen from the leader, and a NameServer's URL, a closed port, a
duplicated URL and bad credentials are refused with errors that name them.
Against a real HTTP server on loopback that answers what it is told to
(forged JSON, error statuses, silence): every kind of garbage is a CutError
naming the URL and the field, never a cut.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from ops.support import OpsCluster

from ledgermq.base import loop
from ledgermq.broker.launcher import node_status, wait_leader
from ledgermq.cli.admin_api import Target
from ledgermq.cli.audit_cut import CutError, NodeReport, capture, choose, parse_status
from ledgermq.client.producer import Producer
from tests.ledgermq.cli.conftest import ledgermq

pytestmark = [pytest.mark.timeout(120)]

TOPIC = "CutUnderLoad"


def commit_of(cluster: OpsCluster, nid: int) -> int:
    status = loop.run(node_status(cluster.client_address(nid)))
    assert status is not None
    return int(status["commit_index"])


def test_cut_under_load_is_the_groups_commit_index(cluster: OpsCluster) -> None:
    leader = loop.run(wait_leader(cluster))
    urls = cluster.admin_urls()
    stop = threading.Event()
    sent = [0]

    async def produce() -> None:
        async with Producer([cluster.namesrv_address], retry_timeout=30.0,
                            name="cut-test") as producer:
            await producer.create_topic(TOPIC, queues=2)
            while not stop.is_set():
                await producer.send(TOPIC, b"x" * 100)
                sent[0] += 1

    writer = threading.Thread(target=loop.run, args=(produce(),), daemon=True)
    writer.start()
    try:
        while sent[0] < 50:  # the group is being written to
            assert writer.is_alive()
            threading.Event().wait(0.05)
        before = commit_of(cluster, leader)
        cut = capture(list(urls.values()), Target())
        after = commit_of(cluster, leader)
    finally:
        stop.set()
        writer.join(30)
    group = cut.groups["broker-a"]
    assert before <= group.index <= after, (before, group, after)
    assert before < after  # the cut was taken while the commit index moved
    assert cut.indexes == {"broker-a": group.index}
    assert cut.cut_args() == ["--cut", f"broker-a={group.index}"]
    assert {n.node_id for n in group.nodes} == set(urls)
    # The nodes are asked one by one while the commit index moves: the
    # leader's answer is the highest, unless a follower asked after it had
    # already learnt a later commit; the cut takes the highest and says so.
    mine = next(n for n in group.nodes if n.node_id == leader)
    assert mine.role == "leader" and mine.commit_index <= group.index
    if mine.commit_index == group.index:
        assert group.source.startswith(f"n{leader} (leader, term ")
        assert f"broker-a={group.index} from n{leader} (leader" in cut.describe()
    else:
        assert group.source.endswith(
            f"(the leader n{leader} of term {mine.term} reports {mine.commit_index})")
        assert f"broker-a={group.index} from n" in cut.describe()


def test_refusals_name_the_url(cluster: OpsCluster, tmp_path: Path) -> None:
    urls = list(cluster.admin_urls().values())
    with pytest.raises(CutError, match="not a broker's admin API"):
        capture([*urls, cluster.namesrv_url], Target())
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(CutError) as caught:
        capture([urls[0], closed], Target(), timeout=5)
    assert f"{closed}: the broker did not answer" in str(caught.value)
    with pytest.raises(CutError, match="given twice"):
        capture([urls[0], urls[0]], Target())
    with pytest.raises(CutError, match="both answer for node"):
        capture([urls[0], urls[0].replace("127.0.0.1", "localhost")], Target())
    with pytest.raises(CutError, match="credentials: an access key and a secret file"):
        capture(urls, Target(access_key="admin"))
    loose = tmp_path / "loose.secret"
    loose.write_text("s3cret")
    loose.chmod(0o644)
    with pytest.raises(CutError, match=r"credentials: .*loose\.secret"):
        capture(urls, Target(access_key="admin", secret_file=str(loose)))
    with pytest.raises(CutError, match="no admin URL"):
        capture([], Target())


class Forger:
    """A real HTTP server on 127.0.0.1 whose /api/v1/status answers
    `answer` with `status` (raw bytes when `answer` is bytes), or never
    answers when `hang` is set."""

    def __init__(self) -> None:
        self.answer: Any = {}
        self.status = 200
        self.hang = False
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _handler(self, request: web.Request) -> web.Response:
        if self.hang:  # until the server stops
            assert self._stop is not None
            await self._stop.wait()
        body = self.answer if isinstance(self.answer, bytes) else json.dumps(self.answer).encode()
        return web.Response(body=body, status=self.status, content_type="application/json")

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/status", self._handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Forger:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


GOOD = {"group": "g1", "node_id": 1, "role": "leader", "term": 3, "commit_index": 40,
        "last_index": 42}


@pytest.fixture
def forger() -> Iterator[Forger]:
    with Forger() as server:
        yield server


@pytest.mark.parametrize(("answer", "status", "message"), [
    (b"<html>proxy error</html>", 200, "answered dict, not a JSON object|an error: <html>"),
    ([GOOD], 200, "answered list, not a JSON object"),
    ({**GOOD, "commit_index": 2**64}, 200, "'commit_index' = 18446744073709551616 is outside"),
    ({**GOOD, "commit_index": -1}, 200, "'commit_index' = -1 is outside"),
    ({**GOOD, "commit_index": "40"}, 200, "'commit_index' is '40', not an integer"),
    ({**GOOD, "commit_index": True}, 200, "'commit_index' is True, not an integer"),
    ({**GOOD, "commit_index": 1.5}, 200, "'commit_index' is 1.5, not an integer"),
    ({**GOOD, "commit_index": 43}, 200, "commit index 43 is beyond the node's last index 42"),
    ({**GOOD, "node_id": 0}, 200, "'node_id' = 0 is outside"),
    ({**GOOD, "term": None}, 200, "'term' is None"),
    ({k: v for k, v in GOOD.items() if k != "last_index"}, 200, "'last_index' is None"),
    ({**GOOD, "group": "a=b"}, 200, "'group' is 'a=b', not a group name"),
    ({**GOOD, "group": ""}, 200, "'group' is '', not a group name"),
    ({**GOOD, "group": 7}, 200, "'group' is '7', not a group name"),
    ({**GOOD, "role": ""}, 200, "'role' is '', not a role"),
    ({"kind": "namesrv"}, 200, "has no 'group': not a broker's admin API"),
    ({"error": {"code": "UNAUTHENTICATED", "message": "sign it"}}, 401,
     "answered 401 UNAUTHENTICATED: sign it"),
    ({"error": {"code": "INTERNAL"}}, 500, "answered 500 INTERNAL"),
])
def test_garbage_is_refused(forger: Forger, answer: Any, status: int, message: str) -> None:
    forger.answer, forger.status = answer, status
    with pytest.raises(CutError, match=message) as caught:
        capture([forger.url], Target(), timeout=5)
    assert str(caught.value).startswith(forger.url)


def test_a_silent_server_times_out(forger: Forger) -> None:
    forger.hang = True
    with pytest.raises(CutError, match=r"did not answer within 0.5 s"):
        capture([forger.url], Target(), timeout=0.5)


def test_a_good_answer_from_the_forger(forger: Forger) -> None:
    forger.answer = GOOD
    cut = capture([forger.url], Target())
    assert cut.indexes == {"g1": 40}
    assert cut.groups["g1"].source == "n1 (leader, term 3)"


def report(node_id: int, role: str, term: int, commit: int, group: str = "g") -> NodeReport:
    return NodeReport(f"http://n{node_id}", group, node_id, role, term, commit, commit + 5)


def test_choose_takes_the_highest_commit_and_says_whose() -> None:
    # A stable group: the leader's commit is the highest.
    cut = choose([report(1, "leader", 4, 100), report(2, "follower", 4, 97),
                  report(3, "follower", 4, 100)])
    assert cut["g"].index == 100 and cut["g"].source == "n1 (leader, term 4)"
    # Just after an election the new leader has not learnt the commit yet: a
    # follower's (committed) index is higher and is taken.
    cut = choose([report(1, "follower", 5, 100), report(2, "leader", 5, 98)])
    assert cut["g"].index == 100
    assert cut["g"].source == "n1 (the leader n2 of term 5 reports 98)"
    # A deposed leader of an older term does not count as the leader.
    cut = choose([report(1, "leader", 4, 90), report(2, "leader", 5, 95)])
    assert cut["g"].index == 95 and cut["g"].source == "n2 (leader, term 5)"
    # During an election nobody leads; every node's commit is committed.
    cut = choose([report(1, "candidate", 6, 95), report(2, "follower", 5, 96)])
    assert cut["g"].index == 96 and cut["g"].source == "n2 (no leader answered)"
    # Several groups at once.
    both = choose([report(1, "leader", 1, 10, "a"), report(1, "leader", 2, 20, "b")])
    assert {name: c.index for name, c in both.items()} == {"a": 10, "b": 20}


def test_parse_status_of_a_real_answer(cluster: OpsCluster) -> None:
    from ledgermq.cli.admin_api import call, target

    url = cluster.admin_urls()[1]
    node = parse_status(url, call(target(url), "GET", "status"))
    assert node.group == "broker-a" and node.node_id == 1 and node.url == url
    assert 0 < node.commit_index <= node.last_index


def test_cli_reports_a_cut_error_in_one_line(cluster: OpsCluster) -> None:
    result = ledgermq("audit", "cut", cluster.namesrv_url)
    assert result.returncode == 1, result
    assert result.stderr.strip() == (f"error: {cluster.namesrv_url}: no /api/v1/status here "
                                     "(404): not a broker's admin API (give each broker's "
                                     "admin URL, not the NameServer's)")
    ok = ledgermq("audit", "cut", *cluster.admin_urls().values())
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("--cut broker-a=")


def test_audit_live_audits_up_to_the_captured_cut(cluster: OpsCluster, tmp_path: Path) -> None:
    """`ledgermq audit --live`: the cut is taken from the brokers first, then
    the group is audited up to it, while the producer of the earlier test's
    topic goes on writing here."""
    leader = loop.run(wait_leader(cluster))
    urls = ",".join(cluster.admin_urls().values())
    specs = "broker-a=" + ",".join(str(cluster.base / f"n{n}") for n in (1, 2, 3))
    stop = threading.Event()

    async def produce() -> None:
        async with Producer([cluster.namesrv_address], retry_timeout=30.0,
                            name="live-audit-test") as producer:
            await producer.create_topic(TOPIC, queues=2)
            while not stop.is_set():
                await producer.send(TOPIC, b"z" * 100)
                await asyncio.sleep(0.005)

    writer = threading.Thread(target=loop.run, args=(produce(),), daemon=True)
    writer.start()
    try:
        threading.Event().wait(0.5)
        before = commit_of(cluster, leader)
        result = ledgermq("audit", "--live", urls, "--engine", "python", "--out",
                          str(tmp_path / "out"), specs, timeout=120)
        after = commit_of(cluster, leader)
        both = ledgermq("audit", "--live", urls, "--cut", "broker-a=1", "--engine", "python",
                        "--out", str(tmp_path / "both"), specs)
    finally:
        stop.set()
        writer.join(30)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cut = int(result.stderr.split("audit: live cut broker-a=")[1].split()[0])
    assert before <= cut <= after and before < after, (before, cut, after)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["valid"] and summary["groups"][0]["window"]["cut"] == cut, summary["groups"]
    assert both.returncode == 2
    assert "audit: --cut and --live both cut broker-a: give one" in both.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    none = ledgermq("audit", "--live", closed, "--engine", "python", "--out",
                    str(tmp_path / "none"), specs)
    assert none.returncode == 2
    assert none.stderr.startswith(f"audit: no live cut: {closed}: the broker did not answer")


def test_a_topic_deleted_after_the_cut_is_told_not_unindexed(cluster: OpsCluster,
                                                              tmp_path: Path) -> None:
    """The live cut's race, on the real group: the cut is taken, then a topic is
    deleted and every broker drops its queues before the audit reads their files.
    The deleting entry lies past the cut; the audit reads the deletions each replica
    applied past its cut, so the topic's messages below the cut are dead, not
    `cq_not_indexed`."""
    topic = "GoneAfterCut"
    specs = "broker-a=" + ",".join(str(cluster.base / f"n{n}") for n in (1, 2, 3))

    async def fill() -> None:
        async with Producer([cluster.namesrv_address], retry_timeout=30.0,
                            name="gone-after-cut") as producer:
            await producer.create_topic(topic, queues=2)
            for i in range(40):
                await producer.send(topic, b"g%03d" % i)

    loop.run(fill())
    leader = loop.run(wait_leader(cluster))
    cut = commit_of(cluster, leader)
    deleted = ledgermq("topic", "delete", topic, "--admin", cluster.namesrv_url,
                       "--token", cluster.token)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    queues = [cluster.base / f"n{n}" / "consumequeue" / topic for n in (1, 2, 3)]
    for _ in range(200):  # every broker applies the deletion and drops the queues
        if not any(q.exists() for q in queues):
            break
        threading.Event().wait(0.05)
    assert not any(q.exists() for q in queues)
    result = ledgermq("audit", "--cut", f"broker-a={cut}", "--engine", "python", "--out",
                      str(tmp_path / "out"), specs, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["valid"], summary
    assert "topic_deleted" in (tmp_path / "out" / "summary.json").read_text()
