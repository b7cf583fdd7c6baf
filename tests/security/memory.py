"""A process's resident memory read from /proc, sampled while an attack runs
(tests/security: the leader's RSS must stay within a stated budget)."""

from __future__ import annotations

import threading


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` in MiB, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class RssWatch:
    """Samples a process's RSS in a thread (every 5 ms) between `__enter__`
    and `__exit__`; `peak` is the highest sample."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            self._stop.wait(0.005)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb(self.pid))
