"""A local cluster with every HTTP admin app on, for the ops tests.

`OpsCluster` is `broker.launcher.LocalCluster` with `admin_listen` on each
broker (ephemeral port, learnt from the node's status) and the NameServer's
admin app turned on through its environment variable (read from its
`namesrv admin listening on URL` line). Every process is stopped by PID.
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

from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, wait_admin_url

TOKEN = "ops-test-token"
_ADMIN_LINE = re.compile(r"namesrv admin listening on (http://\S+)")


class OpsCluster(LocalCluster):
    def __init__(self, base_dir: Path, reports_dir: Path | None = None,
                 token: str = TOKEN) -> None:
        settings = {"admin_listen": "127.0.0.1:0", "admin_token": token,
                    "segment_size_bytes": 4 << 20, "flush": "async", "replicate": "sync"}
        if reports_dir is not None:
            settings["reports_dir"] = str(reports_dir)
        super().__init__(base_dir, nodes=3, settings=settings)
        self.token = token
        self.reports_dir = reports_dir
        self.namesrv_url = ""

    def start(self, timeout: float = 60.0) -> OpsCluster:
        env = {"LEDGERMQ_NAMESRV_ADMIN_LISTEN": "127.0.0.1:0",
               "LEDGERMQ_ADMIN_TOKEN": self.token,
               "LEDGERMQ_REPORTS_DIR": str(self.reports_dir or "")}
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

    def admin_urls(self) -> dict[int, str]:
        return {nid: loop.run(self.admin_url(nid)) for nid in self.alive()}


async def http(method: str, url: str, body: Any = None, *, token: str | None = None,
               raw: bytes | None = None) -> tuple[int, Any]:
    """One request; (status, parsed JSON or text)."""
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        headers["Content-Type"] = "application/json"
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
            method, url, data=data, headers=headers) as resp:
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
