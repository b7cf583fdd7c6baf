"""Loaded by every Python process started with this folder on PYTHONPATH
(bench/profile_calls.py puts it there for the brokers it launches).

With LEDGERMQ_CPROFILE_DIR set, SIGUSR1 starts cProfile in the process and
SIGUSR2 stops it and writes `<pid>.prof` into that folder, so a benchmark
can profile exactly the messages it counts. Without the variable this does
nothing. Not part of the product: the wheel does not ship bench/.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("LEDGERMQ_CPROFILE_DIR")

if _DIR:
    import cProfile
    import signal
    from types import FrameType

    _profile = cProfile.Profile()

    def _start(_signum: int, _frame: FrameType | None) -> None:
        _profile.enable()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        _profile.disable()
        _profile.dump_stats(os.path.join(_DIR, f"{os.getpid()}.prof"))

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
