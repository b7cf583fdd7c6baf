"""A thin synchronous wrapper over the asyncio SDK.

Each wrapper owns an event loop running in a daemon thread and forwards calls
to it with `run_coroutine_threadsafe`, so scripts and threads that are not
async can produce and consume. Push-consumer callbacks run on that loop's
thread: a blocking callback holds up its consumer, not the caller.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ledgermq.base.loop import loop_factory
from ledgermq.client.consumer import PullConsumer, PushConsumer
from ledgermq.client.model import Message, MessageQueue, PullResult, ReceivedMessage, SendResult
from ledgermq.client.producer import Producer

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = loop_factory()()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="ledgermq-client")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class SyncProducer:
    """`Producer` for blocking code: send, send_batch, send_async (a Future), send_oneway."""

    def __init__(self, namesrv: Sequence[str], **options: Any) -> None:
        self._loop = _LoopThread()
        self._producer: Producer = self._loop.run(self._make(namesrv, options))

    @staticmethod
    async def _make(namesrv: Sequence[str], options: dict[str, Any]) -> Producer:
        return Producer(namesrv, **options)

    def send(self, topic: str, body: bytes | Message, **kwargs: Any) -> SendResult:
        return self._loop.run(self._producer.send(topic, body, **kwargs))

    def send_batch(self, topic: str, messages: Sequence[bytes | Message],
                   **kwargs: Any) -> list[SendResult]:
        return self._loop.run(self._producer.send_batch(topic, messages, **kwargs))

    def send_async(self, topic: str, body: bytes | Message, **kwargs: Any) -> Future[SendResult]:
        return self._loop.submit(self._producer.send(topic, body, **kwargs))

    def send_oneway(self, topic: str, body: bytes | Message, **kwargs: Any) -> None:
        self._loop.run(self._producer.send_oneway(topic, body, **kwargs))

    def create_topic(self, topic: str, queues: int = 4, perm: int = 6) -> dict[str, Any]:
        return self._loop.run(self._producer.create_topic(topic, queues, perm))

    def close(self) -> None:
        self._loop.run(self._producer.close())
        self._loop.close()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPullConsumer:
    def __init__(self, namesrv: Sequence[str], group: str, **options: Any) -> None:
        self._loop = _LoopThread()
        self._consumer: PullConsumer = self._loop.run(self._make(namesrv, group, options))

    @staticmethod
    async def _make(namesrv: Sequence[str], group: str, options: dict[str, Any]) -> PullConsumer:
        return PullConsumer(namesrv, group, **options)

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self._consumer.queues(topic))

    def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32,
             tags: list[str] | None = None, wait_ms: int = 0) -> PullResult:
        return self._loop.run(self._consumer.pull(mq, offset, max_messages, tags, wait_ms))

    def committed(self, mq: MessageQueue) -> int:
        return self._loop.run(self._consumer.committed(mq))

    def commit(self, mq: MessageQueue, offset: int) -> None:
        self._loop.run(self._consumer.commit(mq, offset))

    def close(self) -> None:
        self._loop.run(self._consumer.close())
        self._loop.close()


class SyncPushConsumer:
    """`PushConsumer` started and stopped from blocking code."""

    def __init__(self, namesrv: Sequence[str], group: str, topic: str,
                 callback: Callable[[ReceivedMessage], None], **options: Any) -> None:
        self._loop = _LoopThread()
        self._consumer: PushConsumer = self._loop.run(
            self._make(namesrv, group, topic, callback, options))

    @staticmethod
    async def _make(namesrv: Sequence[str], group: str, topic: str,
                    callback: Callable[[ReceivedMessage], None],
                    options: dict[str, Any]) -> PushConsumer:
        return PushConsumer(namesrv, group, topic, callback, **options)

    @property
    def assigned(self) -> list[MessageQueue]:
        return list(self._consumer.assigned)

    def start(self) -> SyncPushConsumer:
        self._loop.run(self._consumer.start())
        return self

    def stop(self) -> None:
        self._loop.run(self._consumer.stop())
        self._loop.close()
