"""The dispatch checkpoint: how far the ConsumeQueues are known durable.

A msgpack map followed by a CRC32C of it (docs/storage-format.md), replaced
atomically after the queue files it covers were fsynced.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
from crc32c import crc32c

from commitlog.disk import atomic_replace, read_small_file
from commitlog.errors import CorruptionError, FormatVersionError


@dataclass
class DispatchCheckpoint:
    dispatched_index: int = 0
    dispatched_end: int = 0
    # (topic, queue id) -> next queue offset at dispatched_index
    queues: dict[tuple[str, int], int] = field(default_factory=dict)
    # Every queue file's slots below its next offset were fsynced before this
    # was written and none was rewritten since: recovery may check those
    # files by length instead of reading them. False in a checkpoint of an
    # older version (the key is absent) and in one recovery rewrites before it
    # changes slots below the claims, until the next checkpoint.
    files_synced: bool = True


def read_dispatch_checkpoint(directory: str) -> DispatchCheckpoint | None:
    """The checkpoint, or None when there is none. CorruptionError when its
    bytes fail the CRC or, CRC intact, do not have the checkpoint's shape (a
    forged or foreign file); FormatVersionError for a version this code does
    not know."""
    path = os.path.join(directory, "checkpoint")
    raw = read_small_file(path)
    if raw is None:
        return None
    if len(raw) < 5 or struct.unpack_from("<I", raw, len(raw) - 4)[0] != crc32c(raw[:-4]):
        raise CorruptionError(path, max(0, len(raw) - 4), "dispatch checkpoint CRC mismatch")
    try:
        value = msgpack.unpackb(raw[:-4])
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise CorruptionError(path, 0, f"dispatch checkpoint is not msgpack: {error}") from None
    if not isinstance(value, dict):
        raise CorruptionError(path, 0, "dispatch checkpoint is not a map")
    if value.get("version") != 1:
        version = value.get("version", -1)
        raise FormatVersionError(path, version if isinstance(version, int) else -1)
    try:
        return _checkpoint_of(value)
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptionError(path, 0, f"dispatch checkpoint has a wrong field: {error!r}"
                              ) from None


def _checkpoint_of(value: dict[str, Any]) -> DispatchCheckpoint:
    """The fields of a decoded checkpoint, checked: an index or position that
    is not a non-negative int, or a queue row that is not [topic, queue id,
    next offset], is a ValueError (TypeError, KeyError for missing ones)."""
    index, end = value["dispatched_index"], value["dispatched_end"]
    queues: dict[tuple[str, int], int] = {}
    for topic, queue_id, nxt in value["queues"]:
        if not (isinstance(topic, str) and _natural(queue_id) and _natural(nxt)):
            raise ValueError(f"queue row {[topic, queue_id, nxt]!r}")
        queues[(topic, queue_id)] = nxt
    if not (_natural(index) and _natural(end)):
        raise ValueError(f"dispatched_index {index!r}, dispatched_end {end!r}")
    return DispatchCheckpoint(index, end, queues, value.get("files_synced", False) is True)


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_dispatch_checkpoint(directory: str, checkpoint: DispatchCheckpoint) -> None:
    payload = msgpack.packb({
        "version": 1,
        "dispatched_index": checkpoint.dispatched_index,
        "dispatched_end": checkpoint.dispatched_end,
        "queues": [[t, q, n] for (t, q), n in sorted(checkpoint.queues.items())],
        "files_synced": checkpoint.files_synced,
    })
    atomic_replace(os.path.join(directory, "checkpoint"),
                   payload + struct.pack("<I", crc32c(payload)))
