"""End to end: headless Chromium opens the NameServer's dashboard of a running
3-node group, sees three nodes and one leader, the leader is SIGKILLed, and
the page shows the new leader without being reloaded. A screenshot is saved
under $LEDGERMQ_ARTIFACTS (or the test's tmp dir) and its path printed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from ops.cdp import Browser, find_chromium
from ops.support import OpsCluster, until
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


def test_dashboard_follows_a_leader_change(tmp_path: Path) -> None:
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    artifacts = Path(os.environ.get("LEDGERMQ_ARTIFACTS") or tmp_path / "artifacts")
    cluster = OpsCluster(tmp_path / "cluster")
    cluster.start()
    try:
        loop.run(_scenario(cluster, chromium, artifacts))
    finally:
        cluster.stop()


async def _scenario(cluster: OpsCluster, chromium: str, artifacts: Path) -> None:
    leader = await wait_leader(cluster)
    async with Producer([cluster.namesrv_address]) as producer:
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
