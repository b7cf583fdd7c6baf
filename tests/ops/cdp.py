"""A headless Chromium driven over the DevTools protocol (aiohttp websockets).

Enough for the dashboard test: open a page, evaluate JavaScript, take a
screenshot. Debian's chromium is used as is (no Playwright browser download);
the process is started here and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """`async with Browser() as b: page = await b.open(url)`."""

    def __init__(self, executable: str, width: int = 1400, height: int = 900,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.executable = executable
        self.extra_args = extra_args
        self.size = (width, height)
        self.proc: subprocess.Popen[bytes] | None = None
        self.profile = Path(tempfile.mkdtemp(prefix="ledgermq-chromium-"))
        self.session: aiohttp.ClientSession | None = None
        self.endpoint = ""

    async def __aenter__(self) -> Browser:
        args = [self.executable, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                f"--window-size={self.size[0]},{self.size[1]}", *self.extra_args,
                "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                await self.close()
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.endpoint = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def open(self, url: str) -> Page:
        assert self.session is not None
        async with self.session.put(f"{self.endpoint}/json/new?about:blank") as resp:
            target = await resp.json(content_type=None)
        ws = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(ws)
        await page.call("Page.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=self.size[0],
                        height=self.size[1], deviceScaleFactor=1, mobile=False)
        await page.call("Page.navigate", url=url)
        return page


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events arriving meanwhile are skipped."""
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            async with asyncio.timeout(30):
                msg = await self.ws.receive_json()
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression,
                                 returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        result = await self.call("Page.captureScreenshot", format="png",
                                 captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))
        return path
