"""Configuration of a CommitLog: sizes, limits and flush policy."""

from __future__ import annotations

from dataclasses import dataclass

from commitlog.errors import ConfigError

MIB = 1024 * 1024


@dataclass(frozen=True)
class CommitLogConfig:
    """Every knob of the CommitLog, with production defaults.

    All replicas of a broker group must use the same `segment_size_bytes`:
    entry placement (and so every position and message id) depends on it.
    """

    segment_size_bytes: int = 256 * MIB
    index_file_records: int = 1024 * 1024
    message_size_bytes_max: int = 4 * MIB
    entry_size_bytes_max: int = 8 * MIB
    # "sync": an append completes after fdatasync (group commit).
    # "async": a background flusher syncs every flush_interval_ms or flush_bytes.
    flush: str = "async"
    flush_interval_ms: int = 200
    flush_bytes: int = 4 * MIB
    # The checkpoint (what recovery trusts without re-reading) is rewritten at
    # most this often; it is a lower bound of what is durable.
    checkpoint_interval_ms: int = 1000
    # The CommitLog's share of the page cache: once synced, bytes more than
    # this far behind the end are dropped from the cache (fadvise DONTNEED),
    # so a node's cached log stays near this size however much it writes.
    # 0 leaves caching to the kernel. docs/architecture.md, "The page cache".
    page_cache_tail_bytes: int = 1024 * MIB
    # "tail": on open, verify from the start of the segment holding the
    # checkpoint; "full": verify every entry of every segment.
    verify_on_open: str = "tail"

    def __post_init__(self) -> None:
        if self.segment_size_bytes < 4096:
            raise ConfigError("segment_size_bytes must be at least 4096")
        if self.index_file_records < 1:
            raise ConfigError("index_file_records must be positive")
        if self.flush not in ("sync", "async"):
            raise ConfigError(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if self.verify_on_open not in ("tail", "full"):
            raise ConfigError("verify_on_open must be 'tail' or 'full'")
        if self.page_cache_tail_bytes < 0:
            raise ConfigError("page_cache_tail_bytes must be 0 (leave it to the kernel) or more")
        if self.message_size_bytes_max < 1:
            raise ConfigError("message_size_bytes_max must be positive")

    @property
    def entry_size_limit(self) -> int:
        """Largest entry accepted: it must also fit in one segment."""
        return min(self.entry_size_bytes_max, self.segment_size_bytes)
