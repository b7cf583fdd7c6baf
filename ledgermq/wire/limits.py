"""Resource bounds of a server port: frame memory, deadlines, connection caps.

`ServerLimits` is the set of numbers an `RpcServer` enforces (docs/security.md,
"Bounded resources"):

- every frame body is read in chunks, each reserved from a server-wide
  `ByteBudget` before it is read, and a compressed frame reserves its declared
  decompressed size before it is decompressed; the reservation is held until
  the request's handler has answered, so the bytes of partial frames *and* of
  requests in flight (a PING echoing 15 MiB) are bounded together;
- a frame must arrive whole within `frame_read_timeout` of its first byte
  (slowloris), a connection with no request for `idle_timeout` and nothing in
  flight is closed;
- connections are capped per source address and overall.

`ConnectionCaps` counts the connections; `release_free_memory` hands freed heap
pages back to the operating system after a large frame (glibc keeps them
otherwise, and RSS would not return to its baseline after a flood).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ledgermq.wire.codec import DEFAULT_MAX_FRAME_BYTES

# A frame at most this large (on the wire and decompressed) is "small": the
# requests of normal clients. Small frames may use the budget's reserve, so
# hostile large partial frames holding the rest cannot starve them.
SMALL_FRAME_BYTES = 64 * 1024
# Bytes reserved and read per step of a frame body: the most a connection
# holds beyond what its reservation covers (the StreamReader's own buffer).
READ_CHUNK_BYTES = 256 * 1024
# Frames before the handshake completes (HELLO, AUTH) are tiny; a stranger
# may not make the server buffer 16 MiB before saying who it is.
DEFAULT_HANDSHAKE_FRAME_BYTES = 64 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """The bounds one server port enforces. Times in seconds; None = no limit."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # Bytes held by partial frames and requests in flight, server-wide.
    frame_memory_budget_bytes: int = 64 * 1024 * 1024
    max_handshake_frame_bytes: int = DEFAULT_HANDSHAKE_FRAME_BYTES
    frame_read_timeout: float | None = 30.0
    idle_timeout: float | None = 300.0
    max_connections: int = 4096
    max_connections_per_address: int = 256

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 1 or self.max_handshake_frame_bytes < 1:
            raise ValueError("frame size limits must be positive")
        # One largest frame plus the small-frame reserve must fit, or a large
        # frame could never be read.
        if self.frame_memory_budget_bytes < self.max_frame_bytes + self.small_reserve:
            raise ValueError(
                "frame_memory_budget_bytes must be at least max_frame_bytes plus 1/8 of itself"
                f" ({self.max_frame_bytes} + {self.small_reserve})")
        if not 1 <= self.max_connections_per_address <= self.max_connections:
            raise ValueError("need 1 <= max_connections_per_address <= max_connections")
        for name in ("frame_read_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None")

    @property
    def small_reserve(self) -> int:
        """Part of the budget only small frames may use."""
        return self.frame_memory_budget_bytes // 8


class ByteBudget:
    """A server-wide count of bytes held by frames, with waiting acquirers.

    `acquire(n, small)` waits until `n` more bytes fit: under the whole total
    for a small frame's bytes, under `total - reserve` for a large frame's.
    Waiters of each kind are served first come, first served.
    """

    def __init__(self, total: int, reserve: int = 0) -> None:
        if not 0 <= reserve < total:
            raise ValueError("need 0 <= reserve < total")
        self.total = total
        self.reserve = reserve
        self.used = 0
        self.peak = 0
        self._waiters: dict[bool, deque[tuple[int, asyncio.Future[None]]]] = {
            True: deque(), False: deque()}

    def _ceiling(self, small: bool) -> int:
        return self.total if small else self.total - self.reserve

    def _fits(self, n: int, small: bool) -> bool:
        # An empty budget admits anything, so a frame larger than the ceiling
        # (not possible with validated ServerLimits) still makes progress.
        return self.used == 0 or self.used + n <= self._ceiling(small)

    def try_acquire(self, n: int, small: bool = False) -> bool:
        """Take `n` bytes now if they fit and nobody of the same kind waits.
        (`_fits` and `_take` spelled out: every request frame comes here.)"""
        used = self.used
        if self._waiters[small] or (used and used + n > (self.total if small else
                                                          self.total - self.reserve)):
            return False
        self.used = used = used + n
        if used > self.peak:
            self.peak = used
        return True

    async def acquire(self, n: int, small: bool = False) -> None:
        """Take `n` bytes, waiting for releases while they do not fit."""
        if self.try_acquire(n, small):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters[small].append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                # Granted in the same pass as our cancellation: give it back.
                self.release(n)
            else:
                with contextlib.suppress(ValueError):
                    self._waiters[small].remove(entry)
            raise

    def release(self, n: int) -> None:
        if n <= 0:
            return
        self.used -= n
        assert self.used >= 0, "released more than acquired"
        waiters = self._waiters
        if waiters[True] or waiters[False]:
            self._wake()

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _wake(self) -> None:
        for small in (True, False):
            queue = self._waiters[small]
            while queue:
                n, fut = queue[0]
                if fut.done():
                    queue.popleft()
                    continue
                if not self._fits(n, small):
                    break
                queue.popleft()
                self._take(n)
                fut.set_result(None)


class ConnectionCaps:
    """Counts open connections per source address and overall."""

    def __init__(self, total: int, per_address: int) -> None:
        self.total = total
        self.per_address = per_address
        self.open = 0
        self._by_address: dict[str, int] = {}

    def admit(self, address: str) -> str | None:
        """Count a new connection from `address`, or say why it is refused
        ("per_address" or "total") without counting it."""
        if self.open >= self.total:
            return "total"
        if self._by_address.get(address, 0) >= self.per_address:
            return "per_address"
        self.open += 1
        self._by_address[address] = self._by_address.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        left = self._by_address.get(address, 0) - 1
        if left > 0:
            self._by_address[address] = left
        else:
            self._by_address.pop(address, None)

    def count(self, address: str) -> int:
        return self._by_address.get(address, 0)


class RateLimitedLog:
    """At most one line per `interval` seconds per key; the count of the
    events in between goes with the next line (a flood must not flood the log)."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def should_log(self, key: str) -> int | None:
        """None to stay quiet, else how many events were not logged before this one."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)


def _libc_function(name: str, *argtypes: type) -> Callable[..., int] | None:
    """A glibc function, or None where there is none (musl, macOS: nothing to do)."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        function = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    found: Callable[..., int] = function
    return found


_malloc_trim = _libc_function("malloc_trim", ctypes.c_size_t)
_mallopt = _libc_function("mallopt", ctypes.c_int, ctypes.c_int)
_M_MMAP_THRESHOLD = -3
# Blocks at least this large are mapped, not carved from the heap.
MMAP_THRESHOLD_BYTES = 1024 * 1024
_heap_bounded = False


def map_large_allocations() -> None:
    """Make glibc serve every allocation of MMAP_THRESHOLD_BYTES or more with
    its own mapping, returned to the system when freed (process-wide, once).

    By default glibc raises that threshold to the size of the largest block
    freed (up to 32 MiB), so after one 15 MiB frame the next ones come from
    the heap, grow by realloc copies and fragment it: a flood of large frames
    then leaves RSS far above both the live data and the frame budget. Fixed
    at 1 MiB, a frame buffer grows by mremap and its memory goes back on free.
    """
    global _heap_bounded
    if _mallopt is not None and not _heap_bounded:
        _heap_bounded = True
        _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_free_memory() -> None:
    """Return free heap pages to the operating system (glibc's malloc_trim).

    Large frame buffers are freed when their request ends, but glibc keeps
    freed heap memory for reuse; after a flood of large frames the process
    would keep its peak RSS. Called when the frame budget drains after large
    frames, so the cost (a walk of the free lists) is paid rarely.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)
