"""`ledgermq acl` against a broker group with a cluster secret: the caller's
credentials come from LEDGERMQ_ACCESS_KEY / LEDGERMQ_SECRET_FILE (or the
flags), and only an administrator may manage users."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.broker.launcher import REPO
from ledgermq.wire.auth import Credentials, read_secret_file
from tests.ledgermq.broker.test_acl_cluster import SecuredCluster, request

pytestmark = pytest.mark.timeout(120)


def ledgermq(*args: str, creds: tuple[str, Path] | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERMQ_")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200")
    if creds is not None:
        env.update(LEDGERMQ_ACCESS_KEY=creds[0], LEDGERMQ_SECRET_FILE=str(creds[1]))
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)


def test_acl_cli_needs_an_administrator(tmp_path: Path) -> None:
    cluster = SecuredCluster(tmp_path / "cluster")
    cluster.start()
    try:
        ns = ("--namesrv", cluster.namesrv_address)
        admin = ("admin", tmp_path / "cluster" / "admin.secret")
        loop.run(cluster.leader())
        anonymous = ledgermq("acl", "user", "list", *ns, creds=None)
        assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
        secret = tmp_path / "app.secret"
        added = ledgermq("acl", "user", "add", "app", "--topic", "t=PUB",
                         "--user-secret-file", str(secret), *ns, creds=admin)
        assert added.returncode == 0, added.stderr
        assert "broker-a: created app: topic t=PUB" in added.stdout
        # The new user can authenticate with the written file, and is no admin.
        app = Credentials("app", read_secret_file(secret))
        leader = loop.run(cluster.leader())
        status = loop.run(request(cluster.address(leader), app, RequestCode.BROKER_STATUS,
                                  None))
        assert status["role"] == "leader"
        refused = ledgermq("acl", "user", "add", "evil", "--admin",
                           "--user-secret-file", str(tmp_path / "evil.secret"), *ns,
                           creds=("app", secret))
        assert refused.returncode == 1
        assert "user 'app' lacks ADMIN" in refused.stderr
        listed = ledgermq("acl", "user", "list", *ns, "--access-key", admin[0],
                          "--secret-file", str(admin[1]), creds=None)
        assert listed.returncode == 0 and "app" in listed.stdout and "evil" not in listed.stdout
    finally:
        cluster.stop()
