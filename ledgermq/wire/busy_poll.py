"""Busy polling: a server's event loop kept awake for a moment after a write
that expects a prompt answer, instead of sleeping in the kernel.

Why. A process idle in `epoll_wait` lets its CPU go idle, and on a virtual
machine an idle vCPU halts. The next message for it then costs twice: the
sender's `write` must wake a halted vCPU (an inter-processor interrupt, a
VM exit; a loopback write of a small frame took about 20 µs of the sender's
CPU against about 10 µs when nobody had to be woken), and the receiver's
loop sees the bytes 15-20 µs after they were written. A W=1 send crosses
four such hops; two of them end at the leader, which knows when its next
message is due: the acknowledgements soon after it sends appends, a
client's next request soon after it answers one (docs/broker.md, "Busy
polling").

How. `expect(window)` (after such a write) pushes the deadline out and, if
no spin runs, queues `_tick` with `call_soon`: it runs after what the loop
had already queued, so after the pass that wrote. A tick asks the kernel,
without blocking (`epoll_wait` with timeout 0, one system call that wakes
nobody), whether any watched connection is readable. While none is and the
deadline is ahead it queues itself again, so the loop does not block; the
first readable connection ends the spin and the loop reads it at once.
Timers and other callbacks keep running between ticks, and the loop's own
polls (which also see what is not watched: a listener, its wake-up pipe)
go on while a callback is queued, only less often than the ticks. A
connection the server stopped reading (backpressure, its in-flight cap)
stays readable and ends every spin at its first tick: no polling then.

Cost: CPU, at most `window` per `expect` (counted in the servers' CPU per
message that bench/produce.py reports), and one system call per tick.
Under load a connection is nearly always readable and a spin ends at its
first tick. One poller serves every watching owner of an event loop
(`shared`), so that a spin started by one (the RPC server) ends for the
messages of another (the Raft transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
import weakref

_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BusyPoll] = (
    weakref.WeakKeyDictionary())


def shared(loop: asyncio.AbstractEventLoop | None = None) -> BusyPoll:
    """The poller of `loop` (the running loop by default), made on first use."""
    if loop is None:
        loop = asyncio.get_running_loop()
    poller = _pollers.get(loop)
    if poller is None:
        poller = _pollers[loop] = BusyPoll(loop)
    return poller


class BusyPoll:
    """The connections of one event loop to poll, and the spin over them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the registry's value must not keep its key, the loop, alive.
        self._loop = weakref.ref(loop)
        self._epoll = select.epoll()
        # fd -> the protocol that watches it, weakly: a protocol holds its
        # transport, which holds the loop, which the registry must not keep.
        self._owners: dict[int, weakref.ref[object]] = {}
        self._deadline = 0.0  # time.perf_counter() seconds
        self._spinning = False
        self.expects = 0  # `expect` calls
        self.spins = 0  # spins started (an `expect` during a spin extends it)
        # Spins a readable connection ended (the others ran out their window,
        # also when the loop itself read the input between two ticks).
        self.ended_by_input = 0

    def watch(self, owner: object, transport: asyncio.BaseTransport) -> int | None:
        """Poll `transport`'s socket during spins, for `owner` (its
        protocol); the descriptor to give `unwatch`, or None if it has none."""
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return None
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except FileExistsError:
            # A closed socket's number, reused before its owner unwatched it.
            self._epoll.modify(fd, select.EPOLLIN)
        except (OSError, ValueError):  # closed already (ValueError: the poller)
            return None
        self._owners[fd] = weakref.ref(owner)
        return fd

    def unwatch(self, owner: object, fd: int) -> None:
        """Stop polling `fd` for `owner` (not if another owner has the number now)."""
        ref = self._owners.get(fd)
        if ref is not None and ref() is owner:
            del self._owners[fd]
            # A closed socket left the epoll set by itself.
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    @property
    def watched(self) -> int:
        return len(self._owners)

    def expect(self, window: float) -> None:
        """Input is due within about `window` seconds: keep the loop awake
        until it arrives or the window passes."""
        self.expects += 1
        deadline = time.perf_counter() + window
        if deadline > self._deadline:
            self._deadline = deadline
        if not self._spinning and self._owners:
            loop = self._loop()
            if loop is None or loop.is_closed():
                return
            self._spinning = True
            self.spins += 1
            loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._spinning = False
        loop = self._loop()
        if self._epoll.closed or loop is None or loop.is_closed():
            return
        if self._epoll.poll(0):
            self.ended_by_input += 1
        elif time.perf_counter() < self._deadline:
            loop.call_soon(self._tick)
            self._spinning = True

    def close(self) -> None:
        self._epoll.close()
        self._owners.clear()
