"""File faults on a stopped node's data directory: power loss, truncation, bit flips.

Power loss uses the storage layer's durability trace (commitlog/disk.py): with
LEDGERMQ_DURABILITY_TRACE=1 every real fsync writes `<file>.durable` holding
the file's durable length, and files written by atomic replace are traced
too. A power cut keeps exactly that: a file with a trace is cut to its
durable length, a file without one was never synced and is removed; the
`.durable` files and the LOCK file stay. Optionally a torn tail of junk
bytes is appended where data was dropped, as a disk that wrote part of a
page would leave. The node must be dead (SIGKILL) before any of this runs.

Every trace is read before any file is touched: a trace that is not one
whole length (torn, damaged, unreadable) raises HarnessError and the data
directory is left exactly as the kill left it. Reading such a trace as "0
bytes durable" would cut fsynced data and fake a loss.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from chaos.backend import HarnessError
from commitlog.disk import TraceError, is_trace_file, read_durable


@dataclass
class CutReport:
    """What a power cut did to one data directory."""

    bytes_dropped: int = 0
    files_truncated: list[str] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)
    torn_bytes: int = 0


def _plan(data_dir: str | Path) -> list[tuple[str, int, int | None]]:
    """(path, size, durable length or None) of every data file; reads every trace first."""
    plan = []
    for root, _dirs, files in os.walk(data_dir):
        for name in sorted(files):
            if is_trace_file(name) or name == "LOCK":
                continue
            path = os.path.join(root, name)
            try:
                keep = read_durable(path)
            except TraceError as exc:
                raise HarnessError(f"power cut of {data_dir} refused, nothing changed: "
                                   f"{exc}") from exc
            plan.append((path, os.path.getsize(path), keep))
    return plan


def power_cut(data_dir: str | Path, *, torn_tail: int = 0,
              rng: random.Random | None = None) -> CutReport:
    """Drop every byte not recorded as durable (optionally leaving a torn tail)."""
    rng = rng or random.Random()
    report = CutReport()
    for path, size, keep in _plan(data_dir):
        if keep is None:
            os.remove(path)
            report.files_removed.append(path)
            report.bytes_dropped += size
        elif keep < size:
            os.truncate(path, keep)
            report.files_truncated.append(path)
            report.bytes_dropped += size - keep
            junk = min(torn_tail, size - keep)
            if junk > 0:  # only where bytes really were lost: a partly written page
                with open(path, "ab") as fh:
                    fh.write(rng.randbytes(junk))
                report.torn_bytes += junk
    return report


def segment_files(data_dir: str | Path) -> list[Path]:
    """The CommitLog segments of a data directory, oldest first."""
    base = Path(data_dir) / "commitlog"
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir()
                  if p.name.isascii() and p.name.isdigit() and p.is_file())


def truncate_tail(path: str | Path, nbytes: int) -> int:
    """Cut the last `nbytes` bytes of a file; returns how many were cut."""
    size = os.path.getsize(path)
    cut = min(nbytes, size)
    os.truncate(path, size - cut)
    return cut


def flip_bits(path: str | Path, count: int, rng: random.Random,
              region: tuple[int, int] | None = None) -> list[int]:
    """Flip `count` random bits of a file (within [start, end) if given); their offsets."""
    size = os.path.getsize(path)
    lo, hi = region or (0, size)
    hi = min(hi, size)
    if hi <= lo:
        return []
    offsets = sorted(rng.randrange(lo, hi) for _ in range(count))
    with open(path, "r+b") as fh:
        for offset in offsets:
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return offsets
