"""SyncThread: calls run off the loop, in order, and their outcome comes back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from commitlog.sync_thread import SyncThread


def test_calls_run_in_order_on_another_thread_and_return_their_results() -> None:
    async def scenario() -> tuple[list[int], list[int], set[int]]:
        worker = SyncThread("test-sync")
        seen: list[int] = []
        threads: set[int] = set()

        def job(n: int) -> int:
            threads.add(threading.get_ident())
            seen.append(n)
            return n * n

        results = await asyncio.gather(*(worker.submit(job, n) for n in range(20)))
        worker.shutdown()
        return list(results), seen, threads

    results, seen, threads = asyncio.run(scenario())
    assert results == [n * n for n in range(20)]
    assert seen == list(range(20))
    assert threads and threading.get_ident() not in threads


def test_an_exception_reaches_the_waiter_and_the_thread_goes_on() -> None:
    def fail(_: object) -> None:
        raise OSError(5, "Input/output error")

    async def scenario() -> int:
        worker = SyncThread("test-sync")
        with pytest.raises(OSError, match="Input/output error"):
            await worker.submit(fail, None)
        value = await worker.submit(len, "after")
        worker.shutdown()
        return value

    assert asyncio.run(scenario()) == 5


def test_shutdown_finishes_what_was_submitted() -> None:
    done: list[int] = []

    async def scenario() -> None:
        worker = SyncThread("test-sync")
        for n in range(5):
            worker.submit(done.append, n)
        worker.shutdown()

    asyncio.run(scenario())
    assert done == [0, 1, 2, 3, 4]


def test_no_thread_until_the_first_job() -> None:
    before = threading.active_count()
    worker = SyncThread("test-sync-idle")
    assert threading.active_count() == before
    worker.shutdown()  # nothing to stop

    async def scenario() -> int:
        return await worker.submit(abs, -3)

    assert asyncio.run(scenario()) == 3
    worker.shutdown()
    assert threading.active_count() == before
