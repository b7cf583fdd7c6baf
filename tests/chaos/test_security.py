"""A secured run's material (chaos.security): secrets the servers accept, a
certificate that verifies at every address the run dials, and the matrix's
secured cells mirroring the open ones."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from chaos.matrix import cells
from chaos.security import WORKLOAD_KEY, generate, workload_user
from ledgermq.wire.auth import read_secret_file
from ledgermq.wire.tls import server_context

HOSTS = ["127.0.0.1", "127.0.0.11", "127.0.0.12", "127.0.0.13"]


def test_generate_makes_private_secrets_and_one_certificate_for_every_host(
        tmp_path: Path) -> None:
    files = generate(tmp_path / "security", HOSTS)
    for path in (files.cluster_secret_file, files.admin_secret_file,
                 files.workload_secret_file, files.key_file):
        assert path.stat().st_mode & 0o077 == 0
    secrets = {read_secret_file(p) for p in (files.cluster_secret_file, files.admin_secret_file,
                                              files.workload_secret_file)}
    assert len(secrets) == 3  # three different secrets
    client = files.client()
    assert client.secure and client.admin is not None and client.user is not None
    assert client.user.access_key == WORKLOAD_KEY
    settings = files.broker_settings()
    assert settings["cluster_secret_file"] == str(files.cluster_secret_file)
    assert files.namesrv_args()[files.namesrv_args().index("--tls-ca-file") + 1] == \
        str(files.ca_file)
    # Secret files are never overwritten: a second run in the same place is refused.
    with pytest.raises(FileExistsError):
        generate(tmp_path / "security", HOSTS)

    async def handshake(host: str) -> None:
        server = await asyncio.start_server(
            lambda r, w: w.close(), "127.0.0.1", 0,
            ssl=server_context(str(files.cert_file), str(files.key_file)))
        port = server.sockets[0].getsockname()[1]
        try:
            # Dial 127.0.0.1 but verify the name `host`, as a peer through a proxy does.
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client.tls,
                                                      server_hostname=host)
            writer.close()
        finally:
            server.close()
            await server.wait_closed()

    for host in HOSTS:
        asyncio.run(handshake(host))
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(handshake("127.0.0.99"))


def test_the_workload_user_may_use_the_run_topic_and_groups_only() -> None:
    body = workload_user("chaos", ["chaos-consumers", "chaos-drain"], b"s" * 32)
    assert body["access_key"] == WORKLOAD_KEY and body["admin"] is False
    assert body["topics"] == {"chaos": "PUB|SUB"}
    assert body["groups"] == {"chaos-consumers": "SUB", "chaos-drain": "SUB"}
    assert "*" not in body["topics"] and "*" not in body["groups"]


def test_secured_matrix_cells_mirror_the_open_ones() -> None:
    open_cells = cells([3, 5])
    both = cells([3, 5], ("open", "secure"))
    secured = [c for c in both if c["secure"]]
    assert [c for c in both if not c["secure"]] == open_cells
    assert len(secured) == len(open_cells)
    for plain, sec in zip(open_cells, secured, strict=True):
        assert sec["name"] == f"secure-{plain['name']}"
        assert {k: v for k, v in sec.items() if k not in ("name", "secure")} == \
            {k: v for k, v in plain.items() if k not in ("name", "secure")}
    with pytest.raises(ValueError, match="unknown security"):
        cells([3], ("tls-only",))
