"""Consume a topic as a member of a consumer group (clustering mode).

    python examples/consume.py --namesrv 127.0.0.1:9876 --topic demo --count 5

The NameServer address can also come from LEDGERMQ_NAMESRV. Against a cluster
with authentication on (`ledgermq dev`'s default) export LEDGERMQ_ACCESS_KEY
and LEDGERMQ_SECRET_FILE first: `credentials_from_env()` reads them. Members
of one group share the topic's queues; run two of these with the same --group
and each gets part of the messages. Offsets are committed to the brokers as
the callback returns, so a restarted member resumes where the group stopped.
Stops after --count messages, or after --idle seconds without one.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from ledgermq.client import PushConsumer, ReceivedMessage, credentials_from_env


async def main(namesrv: str, topic: str, group: str, count: int, idle: float) -> None:
    got = 0
    arrived = asyncio.Event()

    def on_message(message: ReceivedMessage) -> None:
        nonlocal got
        got += 1
        print(f"got {message.body.decode()!r} queue={message.queue_id}"
              f" offset={message.queue_offset}")
        arrived.set()

    async with PushConsumer(namesrv.split(","), group, topic, on_message,
                            credentials=credentials_from_env()):
        while got < count:
            arrived.clear()
            try:
                async with asyncio.timeout(idle):
                    await arrived.wait()
            except TimeoutError:
                break
    print(f"consumed {got} messages")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default=os.environ.get("LEDGERMQ_NAMESRV",
                                                            "127.0.0.1:9876"))
    parser.add_argument("--topic", default="example")
    parser.add_argument("--group", default="example-group")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.namesrv, args.topic, args.group, args.count, args.idle))
