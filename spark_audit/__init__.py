"""Spark consistency audit of LedgerMQ replicas and client histories.

The audit reads every replica's files directly, parsing them from
``docs/storage-format.md`` with its own code (it never imports ``commitlog`` or
``consumequeue``), so that a bug in the broker's storage code cannot hide
itself. Parsing and checks are plain Python/numpy/Arrow functions
(``parse``, ``checks``, ``history``); ``engine`` distributes them, either
in-process or over Spark, and ``report`` writes the results.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "1.0.0"
