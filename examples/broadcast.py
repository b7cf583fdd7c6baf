"""Broadcast consumption: every instance of a group gets every message.

    python examples/broadcast.py --namesrv 127.0.0.1:9876 --topic demo --count 5

The NameServer address can also come from LEDGERMQ_NAMESRV. Against a cluster
with authentication on (`ledgermq dev`'s default) export LEDGERMQ_ACCESS_KEY
and LEDGERMQ_SECRET_FILE first: `credentials_from_env()` reads them. Two
consumers of the same group run here side by side, as two processes of a
service would (a cache each process keeps warm, say). In broadcasting mode
each owns every queue and keeps its offsets in a local file, not on the
brokers; this example keeps those files in a temporary directory. Stops when
both instances have seen --count messages, or after --idle seconds without
progress.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from collections.abc import Callable

from ledgermq.client import PushConsumer, ReceivedMessage, credentials_from_env


async def main(namesrv: str, topic: str, group: str, count: int, idle: float) -> None:
    seen: dict[str, list[str]] = {"instance-1": [], "instance-2": []}
    progress = asyncio.Event()

    def handler(instance: str) -> Callable[[ReceivedMessage], None]:
        def on_message(message: ReceivedMessage) -> None:
            seen[instance].append(message.body.decode())
            print(f"{instance} got {message.body.decode()!r}")
            progress.set()
        return on_message

    with tempfile.TemporaryDirectory() as offsets_dir:
        consumers = [PushConsumer(namesrv.split(","), group, topic, handler(name),
                                  mode="broadcasting", client_id=name,
                                  offsets_path=os.path.join(offsets_dir, f"{name}.json"),
                                  credentials=credentials_from_env())
                     for name in seen]
        for consumer in consumers:
            await consumer.start()
        try:
            while min(len(bodies) for bodies in seen.values()) < count:
                progress.clear()
                try:
                    async with asyncio.timeout(idle):
                        await progress.wait()
                except TimeoutError:
                    break
        finally:
            for consumer in consumers:
                await consumer.stop()
    for instance, bodies in seen.items():
        print(f"{instance} consumed {len(bodies)} messages")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default=os.environ.get("LEDGERMQ_NAMESRV",
                                                            "127.0.0.1:9876"))
    parser.add_argument("--topic", default="example")
    parser.add_argument("--group", default="example-broadcast")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.namesrv, args.topic, args.group, args.count, args.idle))
