"""Where a consumer keeps its progress.

Clustering mode: `RemoteOffsetStore`, on the broker group, through its Raft
log, so a failover never rewinds the group. Broadcasting mode:
`LocalOffsetStore`, a JSON file per consumer (each member has its own
progress), replaced atomically on every flush.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable

from ledgermq.client.model import MessageQueue


class LocalOffsetStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._offsets: dict[str, int] = {}
        if os.path.exists(path):
            with open(path) as fh:
                self._offsets = {k: int(v) for k, v in json.load(fh).items()}

    @staticmethod
    def _key(mq: MessageQueue) -> str:
        return f"{mq.group}|{mq.topic}|{mq.queue_id}"

    async def read(self, mq: MessageQueue) -> int:
        return self._offsets.get(self._key(mq), -1)

    async def commit(self, offsets: dict[MessageQueue, int]) -> None:
        for mq, offset in offsets.items():
            self._offsets[self._key(mq)] = offset
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self._offsets, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


class RemoteOffsetStore:
    """Offsets on the brokers; `commit` sends one request per broker group."""

    def __init__(self, read: Callable[[MessageQueue], Awaitable[int]],
                 commit_group: Callable[[str, dict[MessageQueue, int]], Awaitable[None]]) -> None:
        self._read = read
        self._commit_group = commit_group

    async def read(self, mq: MessageQueue) -> int:
        return await self._read(mq)

    async def commit(self, offsets: dict[MessageQueue, int]) -> None:
        by_group: dict[str, dict[MessageQueue, int]] = {}
        for mq, offset in offsets.items():
            by_group.setdefault(mq.group, {})[mq] = offset
        for group, items in by_group.items():
            await self._commit_group(group, items)
