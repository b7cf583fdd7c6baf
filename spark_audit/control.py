"""Topic deletions, read from CONTROL entries (the broker's schema in docs/broker.md).

A ``topic.delete`` of topic T at entry D makes T's messages in entries below
D dead: the broker drops T's ConsumeQueue files and never indexes them again,
so a re-created T starts at queue offset 0. The ConsumeQueue check must know
this or it reports every dead message as ``cq_not_indexed``. The CommitLog
keeps the dead bytes until retention passes them, and keeps the deleting
entry at least as long (retention removes prefixes), so the deletions that
matter are always in the log: the audit reads them from the CONTROL bodies
(``{"v": 1, "ops": [{"op": "topic.delete", "topic": str}, ...]}``, msgpack),
with its own reader like every other format, skipping what the broker skips
(a body that is not this schema, an op without a string topic).
"""

from __future__ import annotations

import msgpack
import numpy as np

from spark_audit import fmt, parse

# (entry index, topic) of one topic.delete op.
Deletion = tuple[int, str]


def topic_deletions(buf: parse.Buffer, entries: np.ndarray) -> list[Deletion]:
    """The ``topic.delete`` ops of a segment's CONTROL entries whose body passed
    its CRC (``entries``: ``parse.ENTRY_DTYPE`` rows of this segment)."""
    mv = memoryview(buf).cast("B")
    out: list[Deletion] = []
    control = entries[(entries["kind"] == fmt.KIND_CONTROL) & entries["crc_ok"]]
    for off, size, index in zip(control["file_offset"].tolist(), control["size"].tolist(),
                                control["index"].tolist(), strict=True):
        out += body_deletions(index, mv[off + fmt.ENTRY_HEADER_SIZE:off + size])
    return out


def body_deletions(index: int, body: bytes | memoryview) -> list[Deletion]:
    """The ``topic.delete`` ops of the CONTROL body of entry ``index`` (whose CRC
    the caller checked); none for a body that is not the schema."""
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types; the broker skips it too
        return []
    ops = doc.get("ops") if isinstance(doc, dict) else None
    if not isinstance(ops, list):
        return []
    return [(index, op["topic"]) for op in ops
            if isinstance(op, dict) and op.get("op") == "topic.delete"
            and isinstance(op.get("topic"), str)]
