"""A local cluster with every HTTP admin app on, for the ops tests.

`OpsCluster` is `broker.launcher.LocalCluster` with `admin_listen` on each
broker (ephemeral port, learnt from the node's status) and the NameServer's
admin app turned on through its environment variable (read from its
`namesrv admin listening on URL` line). Every process is stopped by PID.

`SecureOpsCluster` turns authentication on (a cluster secret and a bootstrap
administrator, 0600 files) and TLS on the admin apps (a throwaway CA made with
trustme); `signed` makes requests the way ledgermq.client.admin does, with
the pieces exposed so that tests can replay, tamper and skew them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, wait_admin_url
from ledgermq.webadmin.signing import authorization
from ledgermq.wire.auth import Credentials, write_secret_file
from ledgermq.wire.tls import client_context

TOKEN = "ops-test-token"
_ADMIN_LINE = re.compile(r"namesrv admin listening on (https?://\S+)")


class OpsCluster(LocalCluster):
    def __init__(self, base_dir: Path, reports_dir: Path | None = None,
                 token: str = TOKEN, nodes: int = 3) -> None:
        settings: dict[str, Any] = {"admin_listen": "127.0.0.1:0", "admin_token": token,
                                    "segment_size_bytes": 4 << 20, "flush": "async",
                                    "replicate": "sync"}
        if reports_dir is not None:
            settings["reports_dir"] = str(reports_dir)
        super().__init__(base_dir, nodes=nodes, settings=settings)
        self.token = token
        self.reports_dir = reports_dir
        self.namesrv_url = ""
        # More of the NameServer's environment (its command-line options).
        self.namesrv_env: dict[str, str] = {}

    def start(self, timeout: float = 60.0) -> OpsCluster:
        env = {"LEDGERMQ_NAMESRV_ADMIN_LISTEN": "127.0.0.1:0",
               "LEDGERMQ_ADMIN_TOKEN": self.token,
               "LEDGERMQ_REPORTS_DIR": str(self.reports_dir or ""), **self.namesrv_env}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            super().start(timeout)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        assert self.namesrv is not None
        for line in self.namesrv.output:
            if m := _ADMIN_LINE.search(line):
                self.namesrv_url = m.group(1)
        if not self.namesrv_url:
            self.stop()
            raise RuntimeError("the NameServer did not report its admin URL")
        return self

    async def admin_url(self, nid: int, timeout: float = 10.0) -> str:
        return await wait_admin_url(self, nid, timeout)

    def client_options(self) -> dict[str, Any]:
        """What the SDK needs to reach this cluster: nothing (it runs open)."""
        return {}

    def admin_urls(self) -> dict[int, str]:
        return {nid: loop.run(self.admin_url(nid)) for nid in self.alive()}


ADMIN_KEY = "admin"


class SecureOpsCluster(OpsCluster):
    """An OpsCluster with authentication on everywhere and HTTPS admin apps.
    `admin`: the bootstrap administrator's credentials; `ca_file`: the CA
    that signed every admin app's certificate (for 127.0.0.1)."""

    def __init__(self, base_dir: Path, nodes: int = 3, tls: bool = True) -> None:
        super().__init__(base_dir, token="", nodes=nodes)
        secrets_dir = Path(base_dir) / "secrets"
        secrets_dir.mkdir(parents=True)
        self.cluster_secret_file = secrets_dir / "cluster.secret"
        self.admin_secret_file = secrets_dir / "admin.secret"
        cluster_secret = write_secret_file(self.cluster_secret_file)
        self.admin = Credentials(ADMIN_KEY, write_secret_file(self.admin_secret_file))
        self.cluster_member = Credentials("cluster", cluster_secret)
        self.settings.pop("admin_token")
        self.settings.update(cluster_secret_file=str(self.cluster_secret_file),
                             admin_access_key=ADMIN_KEY,
                             admin_secret_file=str(self.admin_secret_file))
        self.namesrv_env = {"LEDGERMQ_CLUSTER_SECRET_FILE": str(self.cluster_secret_file),
                            "LEDGERMQ_NAMESRV_ADMIN_ACCESS_KEY": ADMIN_KEY,
                            "LEDGERMQ_NAMESRV_ADMIN_SECRET_FILE": str(self.admin_secret_file)}
        self.ca_file = ""
        if tls:
            import trustme

            ca = trustme.CA()
            cert = ca.issue_cert("127.0.0.1", "localhost")
            self.ca_file = str(secrets_dir / "ca.pem")
            cert_file, key_file = secrets_dir / "admin.pem", secrets_dir / "admin.key"
            ca.cert_pem.write_to_path(self.ca_file)
            cert.private_key_pem.write_to_path(str(key_file))
            for i, pem in enumerate(cert.cert_chain_pems):
                pem.write_to_path(str(cert_file), append=i > 0)
            # The CA too: with a certificate the brokers' Raft and client ports
            # speak TLS, and peers and NameServers are verified against it; it
            # stays at hand for tests that issue more certificates (an attacker's).
            self.ca = ca
            self.settings.update(tls_cert_file=str(cert_file), tls_key_file=str(key_file),
                                 tls_ca_file=self.ca_file)
            self.namesrv_env.update(LEDGERMQ_NAMESRV_TLS_CERT_FILE=str(cert_file),
                                    LEDGERMQ_NAMESRV_TLS_KEY_FILE=str(key_file),
                                    LEDGERMQ_NAMESRV_TLS_CA_FILE=self.ca_file)

    def client_options(self) -> dict[str, Any]:
        """What the SDK needs to reach this cluster: the admin's credentials
        and, with TLS, a context trusting the cluster's CA."""
        from ledgermq.wire.tls import client_context

        return {"credentials": self.admin,
                "tls": client_context(self.ca_file) if self.ca_file else None}


async def signed(method: str, url: str, body: Any = None, *,
                 credentials: Credentials | None = None, ca_file: str = "",
                 raw: bytes | None = None, header: str | None = None,
                 send_body: bytes | None = None, timestamp_ms: int | None = None,
                 nonce: str | None = None) -> tuple[int, Any, str]:
    """One request signed with `credentials` (or carrying `header` as its
    Authorization as is); (status, answer, the Authorization sent).
    `send_body`: send these bytes instead of the signed ones (tampering)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    if header is None and credentials is not None:
        parts = URL(url, encoded=True)
        header = authorization(credentials, method, parts.raw_path, parts.raw_query_string,
                               data, timestamp_ms=timestamp_ms, nonce=nonce)
    status, answer = await http(method, url, raw=send_body if send_body is not None else data,
                                headers={"Authorization": header} if header else {},
                                ca_file=ca_file)
    return status, answer, header or ""


async def http(method: str, url: str, body: Any = None, *, token: str | None = None,
               raw: bytes | None = None, headers: dict[str, str] | None = None,
               ca_file: str = "") -> tuple[int, Any]:
    """One request; (status, parsed JSON or text). The URL is sent as given
    (no re-quoting)."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data:
        headers["Content-Type"] = "application/json"
    timeout = aiohttp.ClientTimeout(total=20)
    ssl = client_context(ca_file) if ca_file else True
    async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
            method, URL(url, encoded=True), data=data or None, headers=headers,
            ssl=ssl) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll an async predicate until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def wait_group_ready(cluster: SecureOpsCluster, timeout: float = 20.0) -> None:
    """Until the NameServer's signed cluster view names the group's leader
    with its admin URL and lists every node."""
    from ledgermq.client.admin import AdminApi

    async with AdminApi(cluster.namesrv_url, credentials=cluster.admin,
                        ca_file=cluster.ca_file) as api:
        async def ready() -> bool:
            group = (await api.call("GET", "cluster"))["groups"].get(cluster.group) or {}
            return bool(group.get("leader_admin_url")) and \
                len(group.get("nodes", [])) == cluster.nodes

        await until(ready, timeout, "the group's leader on the NameServer")
