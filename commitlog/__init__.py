"""The CommitLog: segmented, append-only, CRC-checked storage that is also the Raft log.

Public surface; the byte layout is specified in docs/storage-format.md.
"""

from commitlog.checkpoint import Checkpoint, HardState
from commitlog.config import CommitLogConfig
from commitlog.entry import (
    HEADER_SIZE,
    KIND_CONTROL,
    KIND_MESSAGES,
    KIND_NOOP,
    Entry,
    encode_entry,
    place,
)
from commitlog.errors import (
    ConfigError,
    CorruptionError,
    DiskFullError,
    DurableDataLostError,
    FormatVersionError,
    LockedError,
    MessageTooLargeError,
    PositionMismatchError,
    StorageError,
)
from commitlog.flush import Flusher
from commitlog.log import CommitLog
from commitlog.message import (
    Message,
    StoredMessage,
    decode_message_at,
    decode_messages,
    encode_message,
    encode_messages,
    iter_records,
    offset_msg_id,
    tag_hash,
)
from commitlog.recovery import RecoveryReport, TailCut
from commitlog.segments import SegmentInfo
from commitlog.snapshot import (
    SnapshotInfo,
    adopt_snapshot,
    latest_snapshot,
    list_snapshots,
    read_state,
    write_snapshot,
)

__all__ = [
    "HEADER_SIZE",
    "KIND_CONTROL",
    "KIND_MESSAGES",
    "KIND_NOOP",
    "Checkpoint",
    "CommitLog",
    "CommitLogConfig",
    "ConfigError",
    "CorruptionError",
    "DiskFullError",
    "DurableDataLostError",
    "Entry",
    "Flusher",
    "FormatVersionError",
    "HardState",
    "LockedError",
    "Message",
    "MessageTooLargeError",
    "PositionMismatchError",
    "RecoveryReport",
    "SegmentInfo",
    "SnapshotInfo",
    "StorageError",
    "StoredMessage",
    "TailCut",
    "adopt_snapshot",
    "decode_message_at",
    "decode_messages",
    "encode_entry",
    "encode_message",
    "encode_messages",
    "iter_records",
    "latest_snapshot",
    "list_snapshots",
    "offset_msg_id",
    "place",
    "read_state",
    "tag_hash",
    "write_snapshot",
]
