"""Spark consistency audit of LedgerMQ replicas and client histories.

The audit reads every replica's files directly, parsing them from
``docs/storage-format.md`` with its own code (it never imports ``commitlog`` or
``consumequeue``), so that a bug in the broker's storage code cannot hide
itself. Parsing and checks are plain Python/numpy functions (``parse``,
``checks``, ``replicas``, ``history``); ``tasks`` turns one file into one
compact result, ``engine``/``spark_engine`` run the file tasks in-process or
over Spark, ``audit`` runs the checks on the results and ``report`` writes
them out.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "1.0.0"
