"""`ledgermq status / topic / group` against the NameServer's admin API of a
running group (in-process Typer runner; the cluster is real processes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ops.support import TOKEN, OpsCluster, SecureOpsCluster, wait_group_ready
from typer.testing import CliRunner

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.cli import app
from ledgermq.client import Producer

pytestmark = [pytest.mark.timeout(120)]


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
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


def test_admin_commands_sign_with_an_access_key(secure_cluster: SecureOpsCluster,
                                                tmp_path: Path) -> None:
    """With authentication on: the commands refuse to run anonymously (one
    line, 401), sign with --access-key/--secret-file or LEDGERMQ_ACCESS_KEY /
    LEDGERMQ_SECRET_FILE, and verify the HTTPS admin API with --tls-ca-file."""
    c = secure_cluster
    loop.run(wait_group_ready(c))
    admin = ["--admin", c.namesrv_url, "--tls-ca-file", c.ca_file]
    creds = ["--access-key", c.admin.access_key, "--secret-file", str(c.admin_secret_file)]
    code, out = cli("topic", "create", "CliAuth", "--queues", "1", *admin)
    assert code == 1 and "401 UNAUTHENTICATED" in out, out
    code, out = cli("status", *admin)
    assert code == 1 and "401 UNAUTHENTICATED" in out, out
    code, out = cli("topic", "create", "CliAuth", "--queues", "1", *admin, *creds)
    assert code == 0 and "1 queues" in out, out
    env = {"LEDGERMQ_ACCESS_KEY": c.admin.access_key,
           "LEDGERMQ_SECRET_FILE": str(c.admin_secret_file)}
    leader = loop.run(wait_leader(c))
    code, out = cli("status", *admin, env=env)
    assert code == 0 and f"leader n{leader}" in out, out
    for args in (("topic", "list"), ("topic", "describe", "CliAuth"), ("group", "list"),
                 ("message", "find", "--topic", "CliAuth", "--key", "k")):
        code, out = cli(*args, *admin, env=env)
        assert code == 0, (args, out)
    code, out = cli("group", "reset", "cli-auth-cg", "--topic", "CliAuth", "--offset", "0",
                    *admin, env=env)
    assert code == 0 and "q0=0" in out, out
    code, out = cli("group", "describe", "cli-auth-cg", *admin, *creds)
    assert code == 0 and "CliAuth" in out, out
    target = leader % 3 + 1
    code, out = cli("leader", "transfer", "--to", f"n{target}", *admin, *creds)
    assert code == 0 and f"leader is now n{target}" in out, out
    code, out = cli("topic", "delete", "CliAuth", *admin, *creds)
    assert code == 0 and "deleted" in out, out
    # Without the CA the server's certificate is not trusted; a readable
    # secret file, or a key without its file, is refused before any request.
    code, out = cli("topic", "list", "--admin", c.namesrv_url, *creds)
    assert code == 1 and "certificate" in out.lower(), out
    loose = tmp_path / "loose.secret"
    loose.write_text("0123456789abcdef0123456789abcdef")
    loose.chmod(0o644)
    code, out = cli("topic", "list", *admin, "--access-key", "admin", "--secret-file", str(loose))
    assert code == 1 and "chmod 600" in out, out
    code, out = cli("topic", "list", *admin, "--access-key", "admin")
    assert code == 1 and "go together" in out, out
