"""Spark consistency audit of LedgerMQ replicas and client histories.

The audit reads every replica's files directly, parsing them from
``docs/storage-format.md`` with its own code (it never imports ``commitlog`` or
``consumequeue``), so that a bug in the broker's storage code cannot hide
itself. Parsing and checks are plain Python/numpy functions (``parse``,
``checks``, ``replicas``, ``history``). On Spark the audit is distributed
(``distributed``): map calls read the files and emit keyed blocks of
per-entry, per-record and per-unit rows (``flow``), reduce calls compare the
replicas per index range (``dlog``), join units with records per position
and find duplicates per identity (``dmsgs``); the driver gets runs, findings
and counts and derives each group's committed prefix from the runs
(``dgroup``). The in-process engine (``engine.LocalEngine``) runs file tasks
(``tasks``) and the checks on the driver's arrays (``audit``); both start
from ``prepare`` and find the same. ``report`` writes the results out;
``cluster`` starts a throwaway standalone cluster for tests and benchmarks.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "1.0.0"
