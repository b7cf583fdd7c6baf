"""Virtual time: one deterministic asyncio loop per simulated process, one clock.

`SimLoop` is an `asyncio.BaseEventLoop` whose `time()` is the shared virtual
clock and whose selector never blocks and never reports I/O (there are no
sockets and no threads in the simulation). `Scheduler` always runs one pass
(`_run_once`) of the loop whose next ready callback or timer is earliest,
moving the clock to that instant first, so a run is a pure function of what
the loops schedule.

- A *process pause* (SIGSTOP) is a loop the scheduler does not run until
  `paused_until`: its timers and the messages delivered to it meanwhile all
  fire late, in one burst, as after a real stop.
- A *crash* is a loop the scheduler never runs again (`dead`): nothing of the
  process runs any more, not even its `finally` blocks. The dead loop is kept
  until the run ends, then `bury` closes its coroutines quietly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
from asyncio import events
from collections.abc import Callable
from typing import Any


class VirtualClock:
    """Seconds of simulated time; only the scheduler moves it."""

    def __init__(self) -> None:
        self.now = 0.0


class _NoSelector:
    """The selector of a loop without I/O: returns at once, with no events."""

    def select(self, timeout: float | None) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """One simulated process's event loop on the virtual clock."""

    # BaseEventLoop's internals that this loop and the scheduler drive (the
    # stubs of the standard library leave them out).
    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _timer_cancelled_count: int
    _run_once: Callable[[], None]

    def __init__(self, clock: VirtualClock, name: str) -> None:
        super().__init__()
        self.set_debug(False)  # debug mode would time callbacks on the real clock
        self._selector = _NoSelector()
        self._clock_resolution = 1e-9
        self.vclock = clock
        self.name = name
        self.paused_until = 0.0
        self.dead = False
        # Calls of the loop's exception handler (an exception nobody caught).
        self.errors: list[dict[str, Any]] = []
        self.set_exception_handler(lambda _loop, context: self.errors.append(context))

    def abandon(self) -> None:
        """The process died: never run again. Its tasks are held until `bury`
        so the garbage collector does not destroy them (and complain) first."""
        self.dead = True
        self._held = list(asyncio.all_tasks(self))

    def time(self) -> float:
        return self.vclock.now

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # nothing to wake: the scheduler runs this loop when its turn comes

    def next_time(self) -> float | None:
        """When this loop has something to do next (None: nothing scheduled)."""
        if self._ready:
            return max(self.vclock.now, self.paused_until)
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            # The same clean-up _run_once does; keeps the head meaningful.
            self._timer_cancelled_count -= 1
            handle = heapq.heappop(scheduled)
            handle._scheduled = False  # type: ignore[attr-defined]  # private, as in _run_once
        if scheduled:
            return max(scheduled[0].when(), self.paused_until)
        return None

    def step(self) -> None:
        """Run one pass of this loop as the running loop."""
        events._set_running_loop(self)
        try:
            self._run_once()
        finally:
            events._set_running_loop(None)

    def run_sync(self, fn: Callable[[], Any]) -> Any:
        """Call `fn` with this loop as the running loop (constructors that
        create futures or tasks), also from inside another loop's pass."""
        previous = events._get_running_loop()
        events._set_running_loop(self)
        try:
            return fn()
        finally:
            events._set_running_loop(previous)

    def bury(self) -> None:
        """Close a dead (or finished) loop's coroutines without running them
        further in virtual time; their clean-up exceptions are suppressed.
        Clean-up code may create tasks (never run): they are closed too."""
        previous = events._get_running_loop()
        events._set_running_loop(self)
        try:
            closed: set[int] = set()
            while True:
                tasks = [t for t in asyncio.all_tasks(self) if id(t) not in closed]
                if not tasks:
                    break
                for task in tasks:
                    closed.add(id(task))
                    task._log_destroy_pending = False  # type: ignore[attr-defined]
                    with contextlib.suppress(BaseException):
                        task.get_coro().close()
        finally:
            events._set_running_loop(previous)
        self._ready.clear()
        self._scheduled.clear()
        self.set_exception_handler(lambda _loop, _context: None)
        with contextlib.suppress(Exception):
            self.close()


class Scheduler:
    """Runs the loop with the earliest work, one pass at a time."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.loops: list[SimLoop] = []  # fixed order: ties go to the first
        self.steps = 0

    def run_until(self, deadline: float, stop: Callable[[], bool] | None = None,
                  max_steps: int = 10_000_000) -> bool:
        """Run until the clock reaches `deadline` (True) or `stop()` holds
        after a pass (False: stopped early)."""
        clock = self.clock
        limit = self.steps + max_steps
        while self.steps < limit:
            best: SimLoop | None = None
            best_at = deadline
            for loop in self.loops:
                if loop.dead:
                    continue
                at = loop.next_time()
                if at is not None and (at < best_at or (best is None and at <= best_at)):
                    best, best_at = loop, at
            if best is None:
                clock.now = max(clock.now, deadline)
                return True
            clock.now = max(clock.now, best_at)
            best.step()
            self.steps += 1
            if stop is not None and stop():
                return False
        raise RuntimeError(f"scheduler: more than {max_steps} steps before {deadline}")
