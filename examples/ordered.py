"""Ordered by key: every event of one order goes to one queue, in order, and
is consumed in that order.

    python examples/ordered.py --namesrv 127.0.0.1:9876 --topic orders --orders 4

The NameServer address can also come from LEDGERMQ_NAMESRV. Against a cluster
with authentication on (`ledgermq dev`'s default) export LEDGERMQ_ACCESS_KEY
and LEDGERMQ_SECRET_FILE first: `credentials_from_env()` reads them. A queue
is a FIFO, so choosing the queue by a hash of the order id (RocketMQ's
MessageQueueSelector) keeps each order's events in sequence; orders on
different queues still proceed in parallel. Each send is awaited before the
next event of the same order: two sends in flight at once could be stored in
either order. (`producer.send(..., sharding_key=order_id)` makes the same
choice for you.) Stops once every event has been consumed, or after --idle
seconds without one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import zlib

from ledgermq.client import (
    MessageQueue,
    Producer,
    PushConsumer,
    ReceivedMessage,
    credentials_from_env,
)

STEPS = ("created", "paid", "shipped", "delivered")


def select(queues: list[MessageQueue], key: str) -> MessageQueue:
    """The queue for a key: the same key always picks the same queue."""
    return queues[zlib.crc32(key.encode()) % len(queues)]


async def produce(namesrv: str, topic: str, orders: list[str]) -> None:
    async with Producer(namesrv.split(","), credentials=credentials_from_env()) as producer:
        await producer.create_topic(topic, queues=4)
        queues = sorted(await producer.cluster.queues(topic, refresh=True))
        for step in STEPS:  # the events of different orders interleave
            for order in orders:
                queue = select(queues, order)
                await producer.send(topic, f"{order} {step}".encode(), keys=order, queue=queue)
                print(f"sent {order} {step} -> queue {queue.queue_id}")


async def consume(namesrv: str, topic: str, group: str, expected: int, idle: float) -> None:
    got = 0
    arrived = asyncio.Event()

    def on_message(message: ReceivedMessage) -> None:
        # One queue's messages reach the callback one at a time, in queue order.
        nonlocal got
        got += 1
        print(f"got {message.body.decode()} queue={message.queue_id}"
              f" offset={message.queue_offset}")
        arrived.set()

    async with PushConsumer(namesrv.split(","), group, topic, on_message,
                            credentials=credentials_from_env()):
        while got < expected:
            arrived.clear()
            try:
                async with asyncio.timeout(idle):
                    await arrived.wait()
            except TimeoutError:
                break
    print(f"consumed {got} of {expected} events")


async def main(namesrv: str, topic: str, group: str, count: int, idle: float) -> None:
    orders = [f"order-{i}" for i in range(count)]
    await produce(namesrv, topic, orders)
    await consume(namesrv, topic, group, len(orders) * len(STEPS), idle)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default=os.environ.get("LEDGERMQ_NAMESRV",
                                                            "127.0.0.1:9876"))
    parser.add_argument("--topic", default="example-orders")
    parser.add_argument("--group", default="example-orders-group")
    parser.add_argument("--orders", type=int, default=4)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.namesrv, args.topic, args.group, args.orders, args.idle))
