"""Loaded by every Python process started with this folder on PYTHONPATH
(bench/cycles.py puts it there for the servers it launches).

With LEDGERMQ_GC_PROBE_DIR set, SIGUSR1 collects whatever is garbage now and
then keeps every object the cyclic collector frees from then on
(`gc.DEBUG_SAVEALL`); SIGUSR2 collects once more and writes what was kept,
counted by type, to `<pid>.json` in that folder, and stops keeping. An
object there was freed only by the cyclic collector: it sat in a reference
cycle, which plain reference counting would have freed at once. Without the
variable this does nothing. Not part of the product: the wheel does not
ship bench/.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("LEDGERMQ_GC_PROBE_DIR")

if _DIR:
    import gc
    import json
    import signal
    from collections import Counter
    from types import FrameType

    def _start(_signum: int, _frame: FrameType | None) -> None:
        gc.collect()
        gc.garbage.clear()
        gc.set_debug(gc.DEBUG_SAVEALL)

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        gc.collect()
        gc.set_debug(0)
        kept = Counter(type(obj).__qualname__ for obj in gc.garbage)
        gc.garbage.clear()
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(dict(kept.most_common()), out)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
