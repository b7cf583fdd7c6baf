"""Administrative clients: the HTTP admin API (`AdminApi`, signed requests)
and read-only queries over the wire protocol (`Admin`: cluster view, topics,
per-node status).

What `ledgermq status / topic / group / message / leader` use; usable from
scripts too:

    async with AdminApi("https://ns:9877", credentials=credentials_from_env(),
                        ca_file="ca.pem") as api:
        await api.call("POST", "topics", {"topic": "Orders"})
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from yarl import URL

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.client.routes import RETRIABLE, Cluster
from ledgermq.webadmin.app import API, AdminApiError
from ledgermq.webadmin.signing import authorization
from ledgermq.wire.auth import Credentials, read_secret_file
from ledgermq.wire.tls import client_context

__all__ = ["Admin", "AdminApi", "AdminApiError", "credentials_from_env", "load_credentials"]

ACCESS_KEY_ENV = "LEDGERMQ_ACCESS_KEY"
SECRET_FILE_ENV = "LEDGERMQ_SECRET_FILE"


def load_credentials(access_key: str = "", secret_file: str = "") -> Credentials | None:
    """Credentials from an access key and a secret file (0600, see
    wire.auth.read_secret_file); None when neither is given. One without the
    other is a mistake worth a clear error."""
    if not access_key and not secret_file:
        return None
    if not (access_key and secret_file):
        raise ValueError("an access key and a secret file go together"
                         f" (--access-key/--secret-file or {ACCESS_KEY_ENV}/{SECRET_FILE_ENV})")
    return Credentials(access_key, read_secret_file(secret_file))


def credentials_from_env() -> Credentials | None:
    """Credentials named by LEDGERMQ_ACCESS_KEY and LEDGERMQ_SECRET_FILE, if set."""
    return load_credentials(os.environ.get(ACCESS_KEY_ENV, ""),
                            os.environ.get(SECRET_FILE_ENV, ""))


class AdminApi:
    """A client of one admin app (a NameServer's or a broker's) over HTTP(S).

    With `credentials` every request is signed (no secret is sent); `token` is
    the pre-signing admin token, for servers that run without authentication.
    `ca_file` verifies an https server's certificate (else the system's CAs).
    """

    def __init__(self, base_url: str, *, credentials: Credentials | None = None,
                 token: str = "", ca_file: str = "", timeout: float = 20.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self.token = token
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = client_context(ca_file) if ca_file else None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdminApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def headers(self, method: str, url: str, body: bytes) -> dict[str, str]:
        """The headers that authenticate a request of `method` to `url`."""
        headers = {"Content-Type": "application/json"} if body else {}
        if self.credentials is not None:
            parts = urlsplit(url)
            headers["Authorization"] = authorization(self.credentials, method, parts.path,
                                                     parts.query, body)
        elif self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def call(self, method: str, path: str, body: Any = None,
                   query: Mapping[str, str | int] | None = None) -> Any:
        """One call (`path` relative to /api/v1, its names already quoted): the
        JSON answer, or AdminApiError (status 0: the server did not answer)."""
        url = f"{self.base_url}{API}/{path.lstrip('/')}"
        if query:
            url = f"{url}?{urlencode(query)}"
        data = json.dumps(body).encode() if body is not None else b""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            # encoded=True: the request goes out exactly as signed.
            async with self._session.request(
                    method, URL(url, encoded=True), data=data or None,
                    headers=self.headers(method, url, data),
                    ssl=self._ssl if self._ssl is not None else True) as resp:
                try:
                    answer = await resp.json(content_type=None)
                except ValueError:
                    answer = {"error": {"code": "BAD_ANSWER", "message": await resp.text()}}
        except aiohttp.ClientError as exc:
            raise AdminApiError(0, "UNREACHABLE", f"{url}: {exc}") from None
        if resp.status >= 400:
            err = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise AdminApiError(resp.status, str(err.get("code", "HTTP_ERROR")),
                                str(err.get("message", answer)))
        return answer


class Admin:
    """Read-only cluster queries over the wire protocol (no admin app needed)."""

    def __init__(self, namesrv: Sequence[str], timeout: float = 3.0, *,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """`credentials`, `tls`: for brokers with authentication / TLS on."""
        self.cluster = Cluster(tuple(namesrv), name="admin", timeout=timeout,
                               credentials=credentials, tls=tls)

    async def close(self) -> None:
        await self.cluster.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def cluster_view(self) -> dict[str, Any]:
        """The NameServer's GET_CLUSTER answer: {groups: {name: {leader, nodes}}}."""
        view: dict[str, Any] = await self.cluster.namesrv_request(RequestCode.GET_CLUSTER, None)
        return view

    async def node_status(self, address: str) -> dict[str, Any] | None:
        """A node's BROKER_STATUS answer, or None when it does not answer."""
        with contextlib.suppress(*RETRIABLE, LedgerMQError):
            status: dict[str, Any] = await self.cluster.request(
                address, RequestCode.BROKER_STATUS, None, timeout=1.5)
            return status
        return None

    async def status(self) -> dict[str, list[dict[str, Any]]]:
        """Per group, every registered node's status (None fields if unreachable)."""
        view = await self.cluster_view()
        out: dict[str, list[dict[str, Any]]] = {}
        for group, info in sorted(view.get("groups", {}).items()):
            nodes = info.get("nodes", [])
            statuses = await asyncio.gather(*(self.node_status(n["address"]) for n in nodes))
            rows = []
            for node, status in zip(nodes, statuses, strict=True):
                rows.append({"node_id": node["node_id"], "address": node["address"],
                             "registered_role": node.get("role"), "status": status})
            out[group] = rows
        return out

    async def topics(self) -> dict[str, dict[str, Any]]:
        """Every topic a leader reports, with its queue offsets ({group: ...} inside)."""
        view = await self.cluster_view()
        result: dict[str, dict[str, Any]] = {}
        for group, info in sorted(view.get("groups", {}).items()):
            addresses = [n["address"] for n in info.get("nodes", [])
                         if n.get("node_id") == info.get("leader")]
            addresses += [n["address"] for n in info.get("nodes", [])
                          if n["address"] not in addresses]
            for address in addresses:
                with contextlib.suppress(*RETRIABLE, LedgerMQError):
                    reply = await self.cluster.request(address, RequestCode.GET_TOPICS, None)
                    for topic, cfg in reply["topics"].items():
                        result.setdefault(topic, {})[group] = cfg
                    break
        return result
