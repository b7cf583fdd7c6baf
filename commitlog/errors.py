"""Errors raised by the storage engine.

Each names what went wrong and, for damaged files, the path and byte offset,
because an operator reading a log line has nothing else to go on.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every storage-engine error."""


class CorruptionError(StorageError):
    """Bytes on disk fail their checks where the data was known durable."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt data in {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class DurableDataLostError(StorageError):
    """Entries the saved hard state vouches for as durable are missing from
    the log: the disk lost acknowledged data (a damaged CommitLog, like
    `CorruptionError`, that recovery found at a clean entry boundary)."""


class FormatVersionError(StorageError):
    """A file carries a format version this code does not know."""

    def __init__(self, path: str, version: int) -> None:
        super().__init__(f"{path}: unsupported format version {version}")
        self.path = path
        self.version = version


class MessageTooLargeError(StorageError):
    """A message or an entry exceeds its configured size limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class DiskFullError(StorageError):
    """The disk refused a write (ENOSPC/EDQUOT); nothing of the append was kept."""


class PositionMismatchError(StorageError):
    """An entry's index or position does not continue the log as placement requires."""


class ConfigError(StorageError):
    """Configuration and on-disk state do not fit together (e.g. segment size)."""


class LockedError(StorageError):
    """Another process holds the data directory's lock."""
