"""The scheduled audit of a live deployment: docker/compose.yml's `audit` profile.

The NameServer and the 3-node group start as in test_compose.py; a producer
writes to the group and keeps writing. Then the audit profile starts:
`spark-master` and `spark-worker` (a Spark standalone cluster; the worker at
idle CPU priority) and `audit` (`ledgermq audit schedule`, every minute and
once at start), which mount every broker's volume read-only. The first night
must pass while the producer writes: it audits the group up to a live cut
taken from the brokers' admin APIs (above the commit index before the audit
started, below the one after it ended), on the cluster, the replicas named
after their brokers; the service logs one line for it. The NameServer,
whose reports directory is the audit's state volume, answers the verdict at
/api/v1/audit, and its dashboard (headless Chromium, signed in as the
administrator) shows it in the audit banner: the screenshot is
docs/dashboard-audit-live.png (LEDGERMQ_ARTIFACTS, else the test's
directory). SIGTERM stops the service cleanly. Teardown removes every
container and volume of the project.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.broker.launcher import node_status
from ledgermq.client.admin import AdminApi
from ledgermq.client.producer import Producer
from ledgermq.wire.auth import Credentials
from tests.docker.deployment import Deployment
from tests.docker.test_compose import wait_leader
from tests.ops.cdp import Browser, find_chromium
from tests.support import require

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

TOPIC = "audited-orders"
STATE = "/var/lib/ledgermq-audit"
NIGHT_TIMEOUT_S = 400.0


@pytest.fixture
def deployment(ledgermq_image: str, audit_image: str) -> Iterator[Deployment]:
    dep = Deployment(ledgermq_image, name="lmqaudit", audit_image=audit_image)
    # A night at start (the cron's next minute is the second chance).
    dep.env.update(LEDGERMQ_AUDIT_SCHEDULE="* * * * *", LEDGERMQ_AUDIT_RUN_AT_START="true",
                   LEDGERMQ_SPARK_WORKER_CORES="1")
    try:
        yield dep
    finally:
        dep.teardown()


class Writer:
    """A producer thread that sends one message at a time, about 100 a
    second, until stopped."""

    def __init__(self, namesrv: str, credentials: Credentials) -> None:
        self.namesrv = namesrv
        self.credentials = credentials
        self.acked = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            async with Producer([self.namesrv], retry_timeout=60.0, name="audit-writer",
                                credentials=self.credentials) as producer:
                await producer.create_topic(TOPIC, queues=4)
                while not self._stop.is_set():
                    await producer.send(TOPIC, f"order-{self.acked}".encode() * 8)
                    self.acked += 1
                    # Paced (~100/s): the audit's containers have the smallest
                    # CPU weight and run on what the brokers leave.
                    await asyncio.sleep(0.01)

        try:
            loop.run(main())
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def commit_index(dep: Deployment, credentials: Credentials) -> int:
    indexes = [s["commit_index"] for s in
               (loop.run(node_status(a, credentials=credentials))
                for a in dep.brokers().values()) if s]
    assert indexes
    return max(indexes)


def exec_text(dep: Deployment, service: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", dep.container(service), *command],
                          capture_output=True, text=True, timeout=60)


# The dashboard's audit banner, read from the DOM.
_BANNER = """(() => {
  const b = document.getElementById('audit');
  if (!b) return null;
  return {state: b.dataset.state, night: b.dataset.night || null, text: b.textContent,
          groups: [...b.querySelectorAll('[data-audit-group]')].map(g => g.dataset.auditGroup)};
})()"""


async def dashboard_banner(url: str, admin: Credentials, night: str, artifacts: Path
                           ) -> dict[str, Any]:
    """The NameServer's dashboard, signed in as the administrator (what the
    sign-in form stores), once its banner shows `night`; a screenshot of it
    goes to `artifacts`/dashboard-audit-live.png."""
    chromium = find_chromium()
    assert chromium is not None
    async with Browser(chromium, width=1400, height=760) as browser:
        page = await browser.open(f"{url}/#/")
        key, secret = json.dumps(admin.access_key), json.dumps(admin.secret.decode())
        await page.evaluate(f"sessionStorage.setItem('lmq.accessKey', {key});"
                            f"sessionStorage.setItem('lmq.secret', {secret});"
                            "location.reload(); true")
        deadline = time.monotonic() + 60
        banner = None
        while time.monotonic() < deadline:
            try:
                banner = await page.evaluate(_BANNER)
            except RuntimeError as exc:
                # The reload above may still be under way: the page we asked
                # is gone and the new one not there yet. Ask again.
                if "navigated or closed" not in str(exc):
                    raise
                await asyncio.sleep(0.2)
                continue
            if banner and banner["night"] == night and banner["state"] != "none":
                await asyncio.sleep(1.0)  # the rest of the page's first poll
                await page.screenshot(artifacts / "dashboard-audit-live.png")
                return dict(banner)
            await asyncio.sleep(0.5)
        raise AssertionError(f"the dashboard never showed night {night}: {banner}")


def wait_night(dep: Deployment) -> str:
    """The audit service's first line about a night."""
    deadline = time.monotonic() + NIGHT_TIMEOUT_S
    while time.monotonic() < deadline:
        logs = dep.compose("logs", "--no-color", "audit", profile="audit").stdout
        nights = [line for line in logs.splitlines() if "audit-schedule: night " in line]
        if nights:
            return nights[0]
        time.sleep(2)
    raise AssertionError("no night within the time limit:\n"
                         + dep.compose("logs", "--no-color", "--tail", "60",
                                       profile="audit").stdout[-6000:])


def test_scheduled_audit_of_the_live_group(deployment: Deployment, tmp_path: Path) -> None:
    chromium = find_chromium()
    require(chromium is not None, "headless Chromium (Debian package 'chromium')")
    artifacts = Path(os.environ.get("LEDGERMQ_ARTIFACTS") or tmp_path / "artifacts")
    dep = deployment
    started = time.monotonic()
    dep.compose("up", "-d", "--no-build")  # the NameServer and the brokers
    admin = dep.admin_credentials(tmp_path)
    assert loop.run(wait_leader(dep.brokers(), admin, 120.0)) is not None
    with Writer(dep.namesrv, admin) as writer:
        while writer.acked < 200:  # the group holds data before the audit starts
            assert writer.error is None, writer.error
            time.sleep(0.1)
        before = commit_index(dep, admin)
        dep.compose("up", "-d", "--no-build", profile="audit")
        line = wait_night(dep)
        acked_during = writer.acked
        after = commit_index(dep, admin)
        assert writer.error is None, writer.error
    night_s = time.monotonic() - started
    logs = dep.compose("logs", "--no-color", "--tail", "80", profile="audit").stdout
    assert ": PASSED (exit 0)" in line, logs[-6000:]
    latest = exec_text(dep, "audit", "cat", f"{STATE}/latest.json")
    assert latest.returncode == 0, latest.stderr
    night = json.loads(latest.stdout)
    assert night["valid"] is True and night["exit"] == 0 and night["violations"] == 0, night
    assert night["master"].startswith("spark://"), night
    group = night["groups"]["broker-a"]
    # Audited up to a live cut: taken after the audit started, while the
    # producer kept the commit index moving.
    assert group["cut_source"] == "admin", group
    assert before < group["cut"] < after, (before, group["cut"], after)
    assert f"cut broker-a={group['cut']} from n" in line, line
    assert set(group["replicas"]) == {"broker-a-1", "broker-a-2", "broker-a-3"}, group
    assert acked_during > 200
    # The Spark worker and what it runs are at idle CPU priority.
    classes = exec_text(dep, "spark-worker", "ps", "-eo", "cls=,comm=").stdout.split("\n")
    assert any(c.split()[:2] == ["IDL", "java"] for c in classes if c.strip()), classes

    # The NameServer serves the state directory as its reports: the verdict
    # at /api/v1/audit, and on the dashboard's banner.
    async def verdict() -> Any:
        async with AdminApi(dep.admin_url, credentials=admin) as api:
            return await api.call("GET", "audit")

    answer = loop.run(verdict())
    assert answer["state"] == "passed", answer
    assert answer["verdict"]["night"] == night["night"], answer
    banner = loop.run(dashboard_banner(dep.admin_url, admin, night["night"], artifacts))
    assert "PASSED" in banner["text"] and banner["groups"] == ["broker-a"], banner
    assert str(group["cut"]) in banner["text"].replace(",", ""), banner

    # SIGTERM (docker stop): the service stops cleanly, with a last line.
    dep.compose("stop", "audit", profile="audit")
    code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}",
                           dep.container("audit")], capture_output=True, text=True,
                          timeout=60).stdout.strip()
    tail = dep.compose("logs", "--no-color", "--tail", "5", "audit", profile="audit").stdout
    assert code == "0" and "audit-schedule: stopped after" in tail, (code, tail)
    print(f"\nfirst night done {night_s:.0f} s after compose up: {line}")
