"""End to end: headless Chromium opens the NameServer's dashboard of a running
3-node group, sees three nodes and one leader, and the nightly audit's
verdict banner follow a real state directory (no audit yet, a night that
passed, then a night that failed with its findings by kind, and the link to
the cross-night report); the leader is SIGKILLed, and the page shows the new
leader without being reloaded. With authentication on, the page signs in and
signs every request it makes. Screenshots are saved under $LEDGERMQ_ARTIFACTS
(or the test's tmp dir) and their paths printed."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from ops.cdp import Browser, find_chromium
from ops.support import OpsCluster, SecureOpsCluster, until, wait_group_ready
from support import require

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.client import Producer

pytestmark = [pytest.mark.timeout(120)]

# What the overview shows, read from the DOM the page built.
_STATE = """(() => {
  const rows = [...document.querySelectorAll('tr[data-node]')];
  return {rows: rows.map(r => [r.dataset.node, r.dataset.role]),
          marker: window.__ledgermq_marker || null,
          summary: (document.getElementById('summary') || {}).textContent || ''};
})()"""


# The audit banner, read from the DOM; `report` fetches the banner's link in the page.
_AUDIT = """(async () => {
  const b = document.getElementById('audit');
  if (!b) return null;
  const link = document.getElementById('audit-report');
  let report = null;
  if (link) {
    const resp = await fetch(link.href);
    report = [resp.status, (await resp.text()).includes('LedgerMQ nightly audit')];
  }
  return {state: b.dataset.state, night: b.dataset.night || null, text: b.textContent,
          kinds: [...b.querySelectorAll('[data-kind]')].map(k => k.dataset.kind),
          groups: [...b.querySelectorAll('[data-audit-group]')].map(g => g.dataset.auditGroup),
          report};
})()"""


def test_dashboard_follows_a_leader_change(tmp_path: Path) -> None:
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    artifacts = Path(os.environ.get("LEDGERMQ_ARTIFACTS") or tmp_path / "artifacts")
    reports = tmp_path / "reports"
    reports.mkdir()
    cluster = OpsCluster(tmp_path / "cluster", reports_dir=reports)
    cluster.start()
    try:
        loop.run(_scenario(cluster, chromium, artifacts, tmp_path))
    finally:
        cluster.stop()


async def _audit_banner(page, cluster: OpsCluster, work: Path, artifacts: Path) -> None:
    """The banner through every state, as the nightly state directory grows: no
    audit yet; two nights that passed, the newer 2 days ago (stale: older than the
    default 36 h); a night that passed an hour ago; a night that failed; a
    latest.json cut short. Each night is the real audit of the recorded real run."""
    from spark_audit import trend
    from tests.spark_audit.nightly_state import DAY, audit_night, build_state, unpack

    async def banner(state: str):
        # index.html is written just after latest.json: the link comes with it.
        b = await page.evaluate(_AUDIT)
        return b if b and b["state"] == state and (state == "none" or b["report"]) else None

    b = await until(lambda: banner("none"), 20, "'no audit yet' on the page")
    assert "No audit yet" in b["text"] and "latest.json" in b["text"]
    base = unpack(work / "base")
    state = cluster.reports_dir / "audit"
    now = time.time()
    docs = build_state(state, base, [None, None], now=now - 2 * DAY)
    b = await until(lambda: banner("stale"), 20, "the stale verdict on the page")
    assert "STALE" in b["text"] and "36 h ago" in b["text"] and b["report"] == [200, True]
    docs.append(audit_night(base, state, now - 3600, previous=docs[-1]))
    trend.write_outputs(str(state))
    b = await until(lambda: banner("passed"), 20, "the passed night on the page")
    assert b["night"] == docs[-1]["night"] and b["groups"] == ["chaos"] and b["kinds"] == []
    assert "PASSED" in b["text"] and "984 entries" in b["text"] and "1 h ago" in b["text"]
    assert b["report"] == [200, True]
    failed = audit_night(base, state, now, case="body_flip", previous=docs[-1])
    trend.write_outputs(str(state))
    b = await until(lambda: banner("failed"), 20, "the failed night on the page")
    assert b["night"] == failed["night"] and "FAILED" in b["text"]
    assert sorted(b["kinds"]) == ["body_crc", "body_mismatch"]
    assert "last passed 1 h ago" in b["text"] and b["report"] == [200, True]
    shot = await page.screenshot(artifacts / "dashboard-audit.png")
    print(f"dashboard screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    latest = state / "latest.json"
    good = latest.read_bytes()
    latest.write_bytes(good[:100])
    b = await until(lambda: banner("unreadable"), 20, "the unreadable verdict on the page")
    assert "malformed JSON" in b["text"] and str(latest) in b["text"]
    latest.write_bytes(good)
    await until(lambda: banner("failed"), 20, "the failed night on the page again")


async def _scenario(cluster: OpsCluster, chromium: str, artifacts: Path, work: Path) -> None:
    leader = await wait_leader(cluster)
    async with Producer([cluster.namesrv_address], **cluster.client_options()) as producer:
        for i in range(40):
            await producer.send("DashboardDemo", b"hello %d" % i, keys=f"k{i}")
    async with Browser(chromium) as browser:
        page = await browser.open(f"{cluster.namesrv_url}/#/")

        async def state() -> dict:
            return await page.evaluate(_STATE) or {}

        async def three_nodes_one_leader():
            s = await state()
            roles = sorted(role for _, role in s.get("rows", []))
            return s if roles == ["follower", "follower", "leader"] else None

        s = await until(three_nodes_one_leader, 20, "three nodes and one leader on the page")
        assert [n for n, r in s["rows"] if r == "leader"] == [f"n{leader}"]
        await _audit_banner(page, cluster, work, artifacts)
        # A marker in the page's JS state: it survives only if the page is not reloaded.
        await page.evaluate("window.__ledgermq_marker = 'same-page'")
        cluster.kill(leader)
        new_leader = await wait_leader(cluster, exclude=(leader,))

        async def new_leader_shown():
            s = await state()
            rows = dict(s.get("rows", []))
            if rows.get(f"n{new_leader}") == "leader" and \
                    rows.get(f"n{leader}") == "unreachable":
                return s
            return None

        s = await until(new_leader_shown, 20, "the new leader on the page")
        assert s["marker"] == "same-page", "the page was reloaded"
        assert sorted(r for _, r in s["rows"]) == ["follower", "leader", "unreachable"]
        await asyncio.sleep(1.2)  # let the throughput chart draw a few more points for the picture
        shot = await page.screenshot(artifacts / "dashboard-after-failover.png")
        print(f"dashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000


_LOGIN = """(() => {
  const form = document.getElementById('login-form');
  if (!form) return false;
  form.elements.access_key.value = %s;
  form.elements.secret.value = %s;
  form.requestSubmit();
  return true;
})()"""
_SIGNED_IN = """(() => ({
  login: !!document.getElementById('login-form'),
  error: (document.getElementById('login-error') || {}).textContent || '',
  user: (document.getElementById('user') || {}).textContent || '',
  rows: [...document.querySelectorAll('tr[data-node]')].map(r => r.dataset.role),
  secure: window.isSecureContext}))()"""


def test_dashboard_signs_in_and_signs_its_requests(tmp_path: Path) -> None:
    """Authentication on, HTTPS: the dashboard shows a sign-in form, refuses a
    wrong secret, and with the right one shows the cluster, every request
    signed in the page (WebCrypto) and checked by the server."""
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    cluster = SecureOpsCluster(tmp_path / "cluster", nodes=1)
    cluster.start()
    try:
        loop.run(_sign_in(cluster, chromium))
    finally:
        cluster.stop()


async def _sign_in(cluster: SecureOpsCluster, chromium: str) -> None:
    await wait_group_ready(cluster)
    # The test CA is not in Chromium's store; the page stays a secure context.
    async with Browser(chromium, extra_args=("--ignore-certificate-errors",)) as browser:
        page = await browser.open(f"{cluster.namesrv_url}/#/")

        async def state() -> dict:
            return await page.evaluate(_SIGNED_IN) or {}

        s = await until(lambda: _having(state, "login"), 20, "the sign-in form")
        assert s["secure"] and s["rows"] == []
        assert await page.evaluate(_LOGIN % (json.dumps("admin"),
                                             json.dumps("wrong-secret-wrong-secret")))
        s = await until(lambda: _having(state, "error"), 20, "the refusal of a wrong secret")
        assert "401" in s["error"]
        secret = cluster.admin.secret.decode()
        assert await page.evaluate(_LOGIN % (json.dumps("admin"), json.dumps(secret)))

        async def cluster_shown():
            s = await state()
            return s if s.get("rows") == ["leader"] else None

        s = await until(cluster_shown, 20, "the cluster after signing in")
        assert "signed in as admin" in s["user"] and not s["login"]
        await asyncio.sleep(2.5)  # it keeps polling, each request freshly signed
        assert (await state())["rows"] == ["leader"]


async def _having(state, key: str):
    s = await state()
    return s if s.get(key) else None


_RETENTION = """(() => ({
  rows: [...document.querySelectorAll('[data-retention-group] tr[data-node]')].map(r =>
    [r.dataset.node, Number(r.dataset.firstIndex), r.dataset.refusing]),
  charts: document.querySelectorAll('[data-retention-group] svg.chart').length}))()"""


def test_dashboard_retention_page(tmp_path: Path) -> None:
    """The Retention page of the NameServer's dashboard shows every replica of
    a group whose oldest segments retention deleted: its first retained
    index (past 1), disk usage and whether it refuses writes, live."""
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    artifacts = Path(os.environ.get("LEDGERMQ_ARTIFACTS") or tmp_path / "artifacts")
    cluster = OpsCluster(tmp_path / "cluster")
    cluster.settings.update(segment_size_bytes=64 * 1024, retention_bytes=256 * 1024,
                            retention_interval_ms=200, snapshot_interval_entries=40)
    cluster.start()
    try:
        loop.run(_retention_page(cluster, chromium, artifacts))
    finally:
        cluster.stop()


async def _retention_page(cluster: OpsCluster, chromium: str, artifacts: Path) -> None:
    await wait_leader(cluster)
    async with Producer([cluster.namesrv_address], **cluster.client_options()) as producer:
        for i in range(600):
            await producer.send("RetentionDemo", b"%06d" % i + b"." * 1000)
    async with Browser(chromium) as browser:
        page = await browser.open(f"{cluster.namesrv_url}/#/retention")

        async def trimmed():
            s = await page.evaluate(_RETENTION) or {}
            rows = s.get("rows", [])
            return s if len(rows) == 3 and all(first > 1 for _, first, _ in rows) else None

        s = await until(trimmed, 60, "three replicas past their first index on the page")
        assert sorted(n for n, _, _ in s["rows"]) == ["n1", "n2", "n3"]
        assert all(refusing == "0" for _, _, refusing in s["rows"]) and s["charts"] == 3
        await asyncio.sleep(1.5)  # a few points on the disk charts for the picture
        shot = await page.screenshot(artifacts / "dashboard-retention.png")
        print(f"dashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000


_MEMBERS = """(() => [...document.querySelectorAll('[data-members-group] tr[data-member]')].map(
  r => [Number(r.dataset.member), r.dataset.role, r.dataset.mismatch]))()"""


def test_dashboard_members_page(tmp_path: Path) -> None:
    """The Members page shows the group's configuration live: three voters,
    then a spare added as a learner through the admin API appears without a
    reload."""
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    artifacts = Path(os.environ.get("LEDGERMQ_ARTIFACTS") or tmp_path / "artifacts")
    cluster = OpsCluster(tmp_path / "cluster", nodes=4)
    cluster.settings["initial_members"] = [1, 2, 3]
    cluster.start()
    try:
        loop.run(_members_page(cluster, chromium, artifacts))
    finally:
        cluster.stop()


async def _members_page(cluster: OpsCluster, chromium: str, artifacts: Path) -> None:
    from ops.support import TOKEN, http

    await wait_leader(cluster)
    async with Browser(chromium) as browser:
        page = await browser.open(f"{cluster.namesrv_url}/#/members")

        async def rows(expected: int):
            found = await page.evaluate(_MEMBERS) or []
            return found if len(found) == expected else None

        first = await until(lambda: rows(3), 30, "three voters on the page")
        assert sorted(first) == [[1, "voter", "0"], [2, "voter", "0"], [3, "voter", "0"]]
        spare = cluster.peers[4]
        status, answer = await http(
            "POST", f"{cluster.namesrv_url}/api/v1/members/add",
            {"group": cluster.group, "node_id": 4, "address": spare.raft,
             "client_address": spare.client, "learner": True}, token=TOKEN)
        assert status == 200, answer
        later = await until(lambda: rows(4), 30, "the learner on the page")
        assert [4, "learner", "0"] in later
        shot = await page.screenshot(artifacts / "dashboard-members.png")
        print(f"dashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000
