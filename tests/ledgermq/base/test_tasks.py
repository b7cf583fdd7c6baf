"""cancel_and_wait: tasks stop, their failures surface, and the caller's own
cancellation is never swallowed (the trap of suppressing CancelledError)."""

from __future__ import annotations

import asyncio

import pytest

from ledgermq.base.tasks import cancel_and_wait


def test_tasks_are_cancelled_and_awaited() -> None:
    async def scenario() -> list[bool]:
        tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in range(3)]
        await asyncio.sleep(0)
        await cancel_and_wait(tasks)
        return [task.cancelled() for task in tasks]

    assert asyncio.run(scenario()) == [True, True, True]


def test_a_task_that_failed_raises_its_error_after_all_finished() -> None:
    async def boom() -> None:
        raise ValueError("worker failed")

    async def scenario() -> asyncio.Task[None]:
        failed = asyncio.create_task(boom())
        sleeper = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="worker failed"):
            await cancel_and_wait([sleeper, failed])
        return sleeper

    assert asyncio.run(scenario()).cancelled()


def test_the_callers_cancellation_propagates_while_it_waits() -> None:
    # A worker that takes a while to stop (its cleanup waits for `release`),
    # and a caller that is itself cancelled meanwhile: the caller must stop,
    # not carry on as `suppress(CancelledError)` around `await task` makes it.
    carried_on: list[str] = []

    async def scenario() -> bool:
        release = asyncio.Event()

        async def slow_to_stop() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.shield(release.wait())

        async def caller(worker: asyncio.Task[None]) -> None:
            await cancel_and_wait([worker])
            carried_on.append("after")

        worker = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        stopper = asyncio.create_task(caller(worker))
        for _ in range(3):  # the caller is now waiting for the worker
            await asyncio.sleep(0)
        assert not worker.done()
        stopper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopper
        release.set()
        await asyncio.wait([worker])
        return worker.cancelled()

    assert asyncio.run(scenario())
    assert carried_on == []
