"""The admin apps' policy in process, over real HTTP on loopback: a user who
is not an administrator reads but gets 403 on every write of the API table
(the handler never runs); the replay cache is bounded; without
authentication an app refuses a non-loopback address unless allowed to run
open; the legacy token guards writes only when authentication is off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from ops.support import http, signed

from ledgermq.base import loop
from ledgermq.base.exposure import ExposureError
from ledgermq.broker.launcher import REPO, LocalCluster
from ledgermq.webadmin.app import (
    PRINCIPAL,
    AdminAuth,
    add_operations,
    check_app_exposure,
    json_response,
    make_app,
    site_url,
    start_site,
)
from ledgermq.webadmin.openapi import COMMON_OPERATIONS, operations
from ledgermq.webadmin.signing import ReplayCache, SignatureError, StaticKeyStore
from ledgermq.wire.auth import Credentials, Principal

pytestmark = [pytest.mark.timeout(60)]

ADMIN = Credentials("root", b"root-secret-0123456789")
READER = Credentials("reader", b"reader-secret-0123456789")
KEYS = StaticKeyStore({ADMIN.access_key: (ADMIN.secret, Principal("root", admin=True)),
                       READER.access_key: (READER.secret, Principal("reader"))})


def _app(auth: AdminAuth, calls: list[str]) -> web.Application:
    """An admin app with the broker's route table, each handler recording its call."""
    app = make_app(auth)

    def handler(name: str):
        async def answer(request: web.Request) -> web.Response:
            calls.append(name)
            return json_response({"op": name, "principal": request[PRINCIPAL].name})
        return answer

    add_operations(app, "broker", {op.name: handler(op.name) for op in operations("broker")
                                   if op.name not in COMMON_OPERATIONS})
    return app


def _concrete(path: str) -> str:
    return (path.replace("{topic}", "Orders").replace("{group}", "cg")
            .replace("{msg_id}", "broker-a@0000000000000000").replace("{action}", "add"))


def test_a_non_admin_reads_but_cannot_write() -> None:
    async def main() -> None:
        calls: list[str] = []
        runner, url = await start_site(_app(AdminAuth(keys=KEYS), calls), "127.0.0.1", 0)
        try:
            for op in operations("broker"):
                if op.name in COMMON_OPERATIONS:
                    continue
                target = url + _concrete(op.path)
                body = {"topic": "Orders", "to": 2, "offset": 0} if op.schema else None
                status, answer, _ = await signed(op.method.upper(), target, body,
                                                 credentials=READER)
                if op.method == "get":
                    assert (status, answer["op"]) == (200, op.name), (op.name, answer)
                else:
                    assert status == 403 and answer["error"]["code"] == "NO_PERMISSION", \
                        (op.name, answer)
                    assert op.name not in calls
                    status, answer, _ = await signed(op.method.upper(), target, body,
                                                     credentials=ADMIN)
                    assert (status, answer["principal"]) == (200, "root"), (op.name, answer)
            assert "create_topic" in calls and "transfer_leadership" in calls
        finally:
            await runner.cleanup()

    loop.run(main())


def test_the_token_guards_writes_only_without_authentication() -> None:
    async def main() -> None:
        calls: list[str] = []
        runner, url = await start_site(_app(AdminAuth(token="tok"), calls), "127.0.0.1", 0)
        try:
            status, _ = await http("GET", f"{url}/api/v1/topics")
            assert status == 200
            status, answer = await http("DELETE", f"{url}/api/v1/topics/Orders")
            assert (status, answer["error"]["code"]) == (401, "TOKEN_REQUIRED")
            status, answer = await http("DELETE", f"{url}/api/v1/topics/Orders", token="nope")
            assert (status, answer["error"]["code"]) == (403, "TOKEN_INVALID")
            status, _ = await http("DELETE", f"{url}/api/v1/topics/Orders", token="tok")
            assert status == 200 and calls == ["topics", "delete_topic"]
        finally:
            await runner.cleanup()

    loop.run(main())


def test_replay_cache_is_bounded_and_forgets_after_the_window() -> None:
    now = [0]
    cache = ReplayCache(capacity=3, keep_ms=1000, clock=lambda: now[0])
    for nonce in ("a1", "a2", "a3"):
        cache.admit("k", nonce)
    with pytest.raises(SignatureError) as err:
        cache.admit("k", "a2")
    assert err.value.reason == "replayed"
    with pytest.raises(SignatureError) as err:
        cache.admit("k", "a4")
    assert err.value.reason == "replay_cache_full"
    now[0] = 1000  # every entry expired: room again, and len() shrinks
    cache.admit("k", "a4")
    assert len(cache) == 1
    cache.admit("other-key", "a4")  # nonces are per access key


def test_no_auth_beyond_loopback_needs_allow_open() -> None:
    open_auth = AdminAuth()
    check_app_exposure("test app", "127.0.0.1", open_auth, allow_open=False)
    check_app_exposure("test app", "::1", open_auth, allow_open=False)
    check_app_exposure("test app", "0.0.0.0", AdminAuth(keys=KEYS), allow_open=False)
    for host in ("0.0.0.0", "10.1.2.3", "", "broker-a.example"):
        with pytest.raises(ExposureError, match="without authentication"):
            check_app_exposure("test app", host, open_auth, allow_open=False)
    check_app_exposure("test app", "0.0.0.0", open_auth, allow_open=True)


def test_namesrv_refuses_an_open_admin_app_on_every_interface() -> None:
    """Through the real command: exit 2 with the reason; --allow-open starts it."""
    command = [sys.executable, "-m", "ledgermq.cli", "namesrv", "--listen", "127.0.0.1:0",
               "--admin-listen", "0.0.0.0:0"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=REPO,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                  "COLUMNS": "200"})
    assert refused.returncode == 2, refused
    assert "without authentication" in refused.stdout + refused.stderr
    proc = subprocess.Popen([*command, "--allow-open"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        # The RUNNING OPEN warnings come first (client port, admin app).
        lines = []
        for _ in range(10):
            lines.append(proc.stdout.readline())
            if "namesrv admin listening on" in lines[-1]:
                break
        assert any("namesrv admin listening on http://" in line for line in lines), lines
        assert any("RUNNING OPEN" in line for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_broker_refuses_an_open_admin_app_on_every_interface(tmp_path: Path) -> None:
    """A real broker process with admin_listen on 0.0.0.0 and no cluster
    secret does not come up, and says why."""
    cluster = LocalCluster(tmp_path, nodes=1, settings={"admin_listen": "0.0.0.0:0"})
    with pytest.raises(RuntimeError):
        cluster.start(timeout=30)
    log = (tmp_path / "logs" / "n1.log").read_text()
    assert "without authentication" in log and "allow_open" in log, log[-2000:]
    assert not cluster.alive()


def test_metrics_auth_and_public_routes() -> None:
    """With authentication on, /metrics and report files are public unless
    metrics_auth; the dashboard's files always are."""
    from prometheus_client import CollectorRegistry

    from ledgermq.webadmin.app import add_common_routes

    async def main() -> None:
        for metrics_auth in (False, True):
            app = _app(AdminAuth(keys=KEYS, metrics_auth=metrics_auth), [])
            add_common_routes(app, registry=CollectorRegistry(), openapi={"openapi": "3.1.0"},
                              reports_dir="", kind="broker")
            runner, url = await start_site(app, "127.0.0.1", 0)
            try:
                for path in ("/", "/static/app.js", "/openapi.json"):
                    assert (await http("GET", url + path))[0] == 200, path
                status, _ = await http("GET", f"{url}/metrics")
                assert status == (401 if metrics_auth else 200)
                status, _, _ = await signed("GET", f"{url}/metrics", credentials=READER)
                assert status == 200
            finally:
                await runner.cleanup()

    loop.run(main())


def test_a_wildcard_listen_is_advertised_at_the_nodes_own_host() -> None:
    """A broker's admin app on 0.0.0.0 (a container) gives out the host its
    clients reach it by, not loopback; a named host is given out as it is."""
    assert site_url(False, "0.0.0.0", 9877, "10.0.0.2") == "http://10.0.0.2:9877"
    assert site_url(True, "::", 9877, "fd00::2") == "https://[fd00::2]:9877"
    assert site_url(False, "0.0.0.0", 9877) == "http://127.0.0.1:9877"
    assert site_url(False, "127.0.0.5", 1, "10.0.0.2") == "http://127.0.0.5:1"
