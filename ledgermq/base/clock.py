"""Millisecond clocks of the broker and the NameServer, in one place.

`monotonic_ms` times liveness (member and broker expiry): it never jumps with
the wall clock. `now_ms` is the wall clock stamped into stored messages.
"""

from __future__ import annotations

import time


def monotonic_ms() -> int:
    """Milliseconds on the monotonic clock (only differences mean anything)."""
    return time.monotonic_ns() // 1_000_000


def now_ms() -> int:
    """Milliseconds since the Unix epoch on the wall clock."""
    return time.time_ns() // 1_000_000
