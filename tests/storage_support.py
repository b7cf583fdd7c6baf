"""Helpers for storage tests: a small-segment config and ways to fill a log."""

from __future__ import annotations

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, Message, encode_messages

SMALL = CommitLogConfig(segment_size_bytes=4096, index_file_records=8,
                        entry_size_bytes_max=4096, message_size_bytes_max=4096)


def message_body(n: int, size: int = 100, topic: str = "T", queue_id: int = 0) -> bytes:
    return encode_messages(
        [Message(topic, bytes([i % 251]) * size, queue_id=queue_id, tags=f"t{i % 3}",
                 producer_id=1, sequence=n * 1000 + i) for i in range(n)],
        1 << 20,
    )


def fill(log: CommitLog, count: int, term: int = 1, size: int = 300) -> None:
    for i in range(count):
        log.append(log.build_entries(term, [(KIND_MESSAGES, message_body(1, size + i % 7))]))
