"""The dispatch checkpoint: how far the ConsumeQueues are known durable.

A msgpack map followed by a CRC32C of it (docs/storage-format.md), replaced
atomically after the queue files it covers were fsynced.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

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
    path = os.path.join(directory, "checkpoint")
    raw = read_small_file(path)
    if raw is None:
        return None
    if len(raw) < 5 or struct.unpack_from("<I", raw, len(raw) - 4)[0] != crc32c(raw[:-4]):
        raise CorruptionError(path, max(0, len(raw) - 4), "dispatch checkpoint CRC mismatch")
    value = msgpack.unpackb(raw[:-4])
    if value.get("version") != 1:
        raise FormatVersionError(path, value.get("version", -1))
    return DispatchCheckpoint(
        value["dispatched_index"], value["dispatched_end"],
        {(topic, queue_id): nxt for topic, queue_id, nxt in value["queues"]},
        value.get("files_synced", False) is True,
    )


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
