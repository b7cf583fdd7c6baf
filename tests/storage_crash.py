"""Crash tests for the storage engine: kill a step at each file-system call in
turn, cut the power, and check what a restart finds.

Runs the real storage code on the real-node simulator's in-memory file system
(`commitlog.fileio.use`), whose power cut keeps what was fsynced plus a seeded
part of the rest, torn pages included.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from commitlog import fileio
from dledger.testing.nodesim.simfs import NO_FAULTS, SimFileSystem


class Killed(Exception):
    """The process was killed at this file-system call."""


class KillingFS(SimFileSystem):
    """The simulator's file system with a kill at the `budget`-th mutating
    call: that call and every later one raise `Killed` (no cleanup runs)."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.budget: int | None = None
        self.calls = 0

    def tick(self) -> None:
        self.calls += 1
        if self.budget is not None and self.calls > self.budget:
            raise Killed(f"killed at file-system call {self.calls}")


def _ticking(name: str) -> Callable[..., Any]:
    original = getattr(SimFileSystem, name)

    def method(self: KillingFS, *args: Any, **kwargs: Any) -> Any:
        self.tick()
        return original(self, *args, **kwargs)

    method.__name__ = name
    return method


# `replace` and `link` keep SimFileSystem's model: a rename within one
# directory is one operation, a name added to or removed from another
# directory is that directory's own (the engine moves files across
# directories by link, fsync, unlink: `commitlog.disk.move_across`).
for _name in ("open", "pwrite", "write", "ftruncate", "fsync", "fdatasync", "remove", "makedirs",
              "rmtree", "replace", "link"):
    setattr(KillingFS, _name, _ticking(_name))


def crash_points(node: str, setup: Callable[[KillingFS], None],
                 action: Callable[[KillingFS], None],
                 check: Callable[[KillingFS, bool], None],
                 seeds: int = 3, limit: int = 10_000) -> int:
    """For each n: on a fresh file system run `setup`, kill `action` at its
    n-th file-system call, cut the power of `node` (`seeds` different ways)
    and `check(fs, completed)` what is left; stop once `action` completes
    (checked after a power cut too). Returns the number of kill points."""
    for point in range(limit):
        completed = False
        for seed in range(seeds):
            fs = KillingFS(random.Random(seed))
            fs.set_faults(node, NO_FAULTS)  # registers the node for `crash`
            with fileio.use(fs):
                setup(fs)
                fs.calls, fs.budget = 0, point
                try:
                    action(fs)
                    completed = True
                except Killed:
                    completed = False
                fs.budget = None
                fs.crash(node, random.Random(seed))
                check(fs, completed)
        if completed:
            return point
    raise AssertionError(f"the action did not complete within {limit} file-system calls")


class KeepNothing(random.Random):
    """A power cut that keeps exactly what was made durable: no queued write,
    no unsynced name operation, no torn page."""

    def randint(self, a: int, b: int) -> int:
        return a

    def random(self) -> float:
        return 0.99


def reopen_points(node: str, setup: Callable[[], None], step: Callable[[], None],
                  look: Callable[[], Any], limit: int = 10_000) -> int:
    """For each n: on a fresh file system run `setup`, kill `step` at its
    n-th file-system call, let a new process `look` at what is left (its
    open may sync things: that is what is tested), kill it too, cut the power
    keeping only what was synced, and check that `look` finds the same again;
    stop once `step` completes. Returns the number of kill points."""
    for point in range(limit):
        fs = KillingFS(random.Random(point))
        fs.set_faults(node, NO_FAULTS)
        with fileio.use(fs):
            setup()
            fs.calls, fs.budget = 0, point
            try:
                step()
                completed = True
            except Killed:
                completed = False
            fs.budget = None
            fs.kill(node)
            seen = look()
            fs.kill(node)
            fs.crash(node, KeepNothing())
            assert look() == seen, f"killed at call {point}: a power cut took what a restart saw"
        if completed:
            return point
    raise AssertionError(f"the step did not complete within {limit} file-system calls")
