"""`ledgermq acl`, run as a user runs it, against the folder's local cluster
(three replicas, authentication off: anyone may manage users there, as anyone
may create topics). Each change must reach every replica of the group."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ops.support import OpsCluster

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire import RpcClient

from .conftest import ledgermq


async def _users_on(address: str) -> dict[str, dict[str, object]]:
    host, port = address.rsplit(":", 1)
    client = await RpcClient.connect(host, int(port))
    try:
        reply = await client.request(RequestCode.ACL_GET_USERS, None)
    finally:
        await client.close()
    return {u["access_key"]: u for u in reply["users"]}


def users_everywhere(cluster: OpsCluster) -> list[dict[str, dict[str, object]]]:
    """Every replica's users (ACL_GET_USERS is served by any node), once all
    replicas agree; the replication is asynchronous to the answer on followers."""
    import time

    deadline = time.monotonic() + 10
    while True:
        seen = []
        for nid in cluster.alive():
            try:
                seen.append(loop.run(_users_on(cluster.client_address(nid))))
            except (OSError, LedgerMQError):
                seen.append({})
        if all(s == seen[0] for s in seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def test_acl_user_lifecycle_reaches_every_replica(cluster: OpsCluster, tmp_path: Path) -> None:
    ns = ("--namesrv", cluster.namesrv_address)
    secret = tmp_path / "alice.secret"
    added = ledgermq("acl", "user", "add", "cli-alice", "--topic", "orders=PUB",
                     "--topic", "*=deny", "--consumer-group", "billing=SUB",
                     "--allow", "127.0.0.0/8", "--user-secret-file", str(secret), *ns)
    assert added.returncode == 0, added.stderr
    assert "broker-a: created cli-alice from 127.0.0.0/8: topic *=DENY, topic orders=PUB," \
        " group billing=SUB" in added.stdout
    assert f"secret of cli-alice written to {secret}" in added.stdout
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    written = secret.read_bytes().strip()
    assert len(written) >= 32 and written.decode() not in added.stdout
    # Stored on every replica, with the secret from the file.
    for users in users_everywhere(cluster):
        assert users["cli-alice"]["topics"] == {"*": "DENY", "orders": "PUB"}

    granted = ledgermq("acl", "grant", "cli-alice", "--topic", "audit=PUB|SUB",
                       "--consumer-group", "*=SUB", *ns)
    assert granted.returncode == 0, granted.stderr
    revoked = ledgermq("acl", "revoke", "cli-alice", "--topic", "orders",
                       "--consumer-group", "billing", *ns)
    assert revoked.returncode == 0, revoked.stderr
    assert "topic *=DENY, topic audit=PUB|SUB, group *=SUB" in revoked.stdout

    # Added again with the same file: replaced, the secret read from it.
    again = ledgermq("acl", "user", "add", "cli-alice", "--admin",
                     "--user-secret-file", str(secret), *ns)
    assert again.returncode == 0, again.stderr
    assert "replaced cli-alice admin: no grants" in again.stdout
    assert "written" not in again.stdout

    listed = ledgermq("acl", "user", "list", "-o", "json", *ns)
    assert listed.returncode == 0, listed.stderr
    users = {u["access_key"]: u for u in json.loads(listed.stdout)["groups"]["broker-a"]}
    assert users["cli-alice"] == {"access_key": "cli-alice", "admin": True, "allow": [],
                                  "topics": {}, "groups": {}}
    assert written.decode() not in listed.stdout and "secret" not in listed.stdout
    table = ledgermq("acl", "user", "list", *ns)
    assert "cli-alice" in table.stdout

    removed = ledgermq("acl", "user", "remove", "cli-alice", *ns)
    assert removed.returncode == 0 and "broker-a: removed cli-alice" in removed.stdout
    for users in users_everywhere(cluster):
        assert "cli-alice" not in users
    gone = ledgermq("acl", "user", "remove", "cli-alice", *ns)
    assert "no such user cli-alice" in gone.stdout


def test_acl_cli_refusals_are_one_line(cluster: OpsCluster, tmp_path: Path) -> None:
    ns = ("--namesrv", cluster.namesrv_address)
    half = ledgermq("acl", "user", "list", "--access-key", "admin", *ns)
    assert half.returncode == 1
    assert half.stderr.strip() == ("error: give --access-key and --secret-file together"
                                   " (or LEDGERMQ_ACCESS_KEY and LEDGERMQ_SECRET_FILE)")
    loose = tmp_path / "loose.secret"
    loose.write_text("x" * 40)
    loose.chmod(0o644)
    refused = ledgermq("acl", "user", "list", "--access-key", "admin", "--secret-file",
                       str(loose), *ns)
    assert refused.returncode == 1 and "accessible by group or others" in refused.stderr
    # The user's own secret file is held to the same rule.
    bad = ledgermq("acl", "user", "add", "cli-bob", "--user-secret-file", str(loose), *ns)
    assert bad.returncode == 1 and "chmod 600" in bad.stderr
    perm = ledgermq("acl", "user", "add", "cli-bob", "--topic", "t=ALL",
                    "--user-secret-file", str(tmp_path / "bob.secret"), *ns)
    assert perm.returncode == 1
    assert "a topic grant is PUB, SUB, PUB|SUB or DENY, not 'ALL'" in perm.stderr
    assert len(perm.stderr.strip().splitlines()) == 1
    unknown = ledgermq("acl", "grant", "cli-nobody", "--topic", "t=PUB", *ns)
    assert unknown.returncode == 1 and "no ACL user 'cli-nobody'" in unknown.stderr
    no_group = ledgermq("acl", "user", "list", "--group", "broker-z", *ns)
    assert no_group.returncode == 1 and "no broker group 'broker-z'" in no_group.stderr
