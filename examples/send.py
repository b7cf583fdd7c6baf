"""Send messages to a topic and print where each one was stored.

    python examples/send.py --namesrv 127.0.0.1:9876 --topic demo --count 5

The NameServer address can also come from LEDGERMQ_NAMESRV. Against a cluster
with authentication on (`ledgermq dev`'s default) export LEDGERMQ_ACCESS_KEY
and LEDGERMQ_SECRET_FILE first: `credentials_from_env()` reads them. Each
`send` returns once the broker group has the message (replicated and, by
default, fsynced): its id, queue and offset are what `ledgermq message get`
looks up.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from ledgermq.client import Producer, credentials_from_env


async def main(namesrv: str, topic: str, count: int) -> None:
    async with Producer(namesrv.split(","), credentials=credentials_from_env()) as producer:
        await producer.create_topic(topic, queues=4)
        for i in range(count):
            body = f"hello {i}"
            result = await producer.send(topic, body.encode(), tags="example", keys=f"k{i}")
            assert result.queue_offset is not None  # None only with replicate=async
            print(f"sent {body!r} id={result.msg_id} queue={result.queue.queue_id}"
                  f" offset={result.queue_offset}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default=os.environ.get("LEDGERMQ_NAMESRV",
                                                            "127.0.0.1:9876"))
    parser.add_argument("--topic", default="example")
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.namesrv, args.topic, args.count))
