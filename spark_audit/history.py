"""Client histories (chaos ``history.jsonl``) against the committed log.

One JSON object per line: ``{"index", "time_ns", "process", "type":
"invoke"|"ok"|"fail"|"info", "f": "send"|"poll"|..., "value": {...}}``. A send
or poll value names one message: ``topic``, ``queue``, ``producer_id``,
``sequence``, ``offset`` (queue offset), ``msg_id`` (``<group>@<16 hex>``),
``group``. A poll may instead carry ``"messages": [value, ...]``. Messages are
matched by (group, producer_id, sequence) when the producer id is non-zero,
else by the physical offset in ``msg_id``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit.checks import INFO, VIOLATION, Findings

# The longest history line read (newline included): a poll that names
# thousands of messages is a few hundred KiB.
LINE_BYTES_MAX = 16 << 20

KEY_SCHEMA = pa.schema([
    ("gid", pa.int32()), ("producer_id", pa.int64()), ("sequence", pa.int64()),
    ("phys_offset", pa.int64()),
])


@dataclass(frozen=True)
class HistMsg:
    """One message named by a history operation."""

    file: str
    line: int
    op_index: int
    time_ns: int
    process: str
    type: str
    f: str
    group: str
    topic: str
    queue: int
    producer_id: int
    sequence: int
    queue_offset: int
    phys_offset: int  # from msg_id, -1 when absent
    body_crc: int = -1  # CRC32C of the body the op names (``body_crc32c``), -1 when absent


def _signed(v: int) -> int:
    """u64 as the int64 with the same bits (how the audit tables store it)."""
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


_MSG_ID_HEX = 16  # ``<group>@<16 hex digits>``: the physical offset
_U32, _U64, _I63 = (1 << 32) - 1, (1 << 64) - 1, (1 << 63) - 1


def _int(v: dict[str, Any], name: str, hi: int, default: int, lo: int = 0) -> int:
    """Field ``name`` of ``v``: absent (or null) gives ``default``; anything else must
    be an integer in lo..hi (a bool, float or string is refused, not guessed at)."""
    x = v.get(name)
    if x is None:
        return default
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise ValueError(f"{name} {x!r} is not an integer in {lo}..{hi}")
    return x


def _str(v: dict[str, Any], name: str) -> str:
    x = v.get(name)
    if x is None:
        return ""
    if not isinstance(x, str):
        raise ValueError(f"{name} {x!r} is not a string")
    return x


def _one(path: str, line: int, op: dict[str, Any], v: dict[str, Any]) -> HistMsg:
    msg_id, group = _str(v, "msg_id"), _str(v, "group")
    phys = -1
    if msg_id:
        head, _, hexpart = msg_id.rpartition("@")
        try:
            phys = int(hexpart, 16) if len(hexpart) == _MSG_ID_HEX and head else -1
        except ValueError:
            phys = -1
        if not 0 <= phys <= _I63:
            raise ValueError(f"msg_id {msg_id!r} is not <group>@<16 hex digits> naming an "
                             "offset up to 2^63-1")
        group = group or head
    process = op.get("process", "")
    return HistMsg(path, line, _int(op, "index", _I63, -1), _int(op, "time_ns", _I63, 0),
                   str(process), _str(op, "type"), _str(op, "f"), group, _str(v, "topic"),
                   _int(v, "queue", _U32, -1, lo=-1), _signed(_int(v, "producer_id", _U64, 0)),
                   _signed(_int(v, "sequence", _U64, 0)), _int(v, "offset", _I63, -1, lo=-1), phys,
                   _int(v, "body_crc32c", _U32, -1))


def read_history(paths: list[str]) -> tuple[list[HistMsg], int]:
    """Messages named by completed send and poll operations, and the number of ops read.

    Invocations carry no outcome and are skipped; nemesis and other ops are
    counted but otherwise ignored. A malformed line raises ``ValueError``
    naming the file and line: not JSON, not an object, or a send or poll
    whose value, message list or message fields have the wrong shape, type or
    range, or longer than LINE_BYTES_MAX. A history the audit cannot read in
    full is not checked in part: a skipped line could be the acknowledged send
    that was lost.
    """
    out: list[HistMsg] = []
    ops = 0
    for path in paths:
        with open(path, "rb") as fh:
            # readline with a limit: a line is held in memory whole, and a
            # file with no newline (a wrong path, /dev/zero) would be read
            # until memory ran out.
            for n, raw in enumerate(iter(lambda: fh.readline(LINE_BYTES_MAX + 1), b""), 1):
                if len(raw) > LINE_BYTES_MAX:
                    raise ValueError(f"{path}:{n}: a line of more than {LINE_BYTES_MAX} bytes:"
                                     " not a client history")
                if not raw.strip():
                    continue
                ops += 1
                try:
                    out.extend(_messages(path, n, raw.decode("utf-8")))
                except ValueError as exc:  # UnicodeDecodeError is one too
                    raise ValueError(f"{path}:{n}: {exc}") from exc
    return out, ops


def _messages(path: str, n: int, text: str) -> list[HistMsg]:
    """The messages one line's operation names (none for invocations and other ops)."""
    try:
        op = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("not JSON: nested deeper than the parser goes") from exc
    if not isinstance(op, dict):
        raise ValueError(f"not a JSON object but {type(op).__name__}")
    if op.get("f") not in ("send", "poll") or op.get("type") == "invoke":
        return []
    if op.get("type") not in ("ok", "fail", "info"):
        raise ValueError(f"type {op.get('type')!r} is not invoke, ok, fail or info")
    value = op.get("value")
    if not isinstance(value, dict):
        raise ValueError(f"the {op.get('f')} operation's value is not an object: {value!r:.80}")
    items = value.get("messages", [value])
    if not isinstance(items, list):
        raise ValueError(f"messages is not a list: {items!r:.80}")
    msgs = []
    for i, v in enumerate(items):
        if not isinstance(v, dict):
            raise ValueError(f"message {i} is not an object: {v!r:.80}")
        try:
            msgs.append(_one(path, n, op, v))
        except ValueError as exc:
            raise ValueError(f"message {i}: {exc}") from exc
    return msgs


def history_keys(msgs: list[HistMsg], group_ids: dict[str, int]) -> pa.Table:
    """The lookup keys to find in the committed log (one row per distinct key)."""
    rows: set[tuple[int, int, int, int]] = set()
    for m in msgs:
        gid = group_ids.get(m.group, -1) if m.group else (
            next(iter(group_ids.values())) if len(group_ids) == 1 else -1)
        if gid >= 0:
            rows.add((gid, m.producer_id, m.sequence, m.phys_offset))
    cols: Sequence[Sequence[int]] = (list(zip(*sorted(rows), strict=True)) if rows
                                     else [[], [], [], []])
    return pa.table(dict(zip(KEY_SCHEMA.names, cols, strict=True)), schema=KEY_SCHEMA)


def send_digests(msgs: list[HistMsg], group_ids: dict[str, int]) -> dict[int, pd.DataFrame]:
    """Per group, the body CRC each sent client identity must carry.

    One row per (producer_id, sequence) of a send with a recorded body digest,
    whatever its outcome: whether or not it was stored, a stored message with
    that identity must hold the body that was sent.
    """
    rows: dict[int, dict[tuple[int, int], tuple[int, HistMsg]]] = {}
    for m in msgs:
        if m.f != "send" or m.producer_id == 0 or m.body_crc < 0:
            continue
        gid = group_ids.get(m.group, -1) if m.group else (
            next(iter(group_ids.values())) if len(group_ids) == 1 else -1)
        if gid >= 0:
            rows.setdefault(gid, {})[(m.producer_id, m.sequence)] = (m.body_crc, m)
    out = {}
    for gid, by_key in rows.items():
        keys = list(by_key)
        out[gid] = pd.DataFrame({
            "producer_id": np.array([k[0] for k in keys], np.int64),
            "sequence": np.array([k[1] for k in keys], np.int64),
            "want_crc": np.array([by_key[k][0] for k in keys], np.int64),
            "where": [f"{by_key[k][1].file}:{by_key[k][1].line}" for k in keys]})
    return out


def check_history(msgs: list[HistMsg], found: pa.Table, group_ids: dict[str, int],
                  max_examples: int = 20, retained_from: dict[int, int] | None = None,
                  retained_away: dict[int, list[tuple[int, int]]] | None = None
                  ) -> tuple[pa.Table, dict[str, int]]:
    """Acknowledged sends must be committed, consumed messages must exist, failed sends not.

    ``found`` holds the committed messages (columns gid, producer_id,
    sequence, phys_offset) that matched any history key. ``retained_from``
    gives per group the lowest log position any replica still holds (0: the
    whole log is kept). A message absent from the log whose position (from its
    ``msg_id``) is below it was removed by retention on every replica: the
    audit can neither confirm nor refute it. So was one whose position lies in
    a ``retained_away`` range of its group (per group, ``[start, end)``
    positions of committed entries that retention removed from every replica
    and no replica should still hold: a stopped replica's log ends below them,
    the others' starts above). Such a message is counted and reported as
    *outside retention* (``acked_send_outside_retention``,
    ``consumed_outside_retention``, info), never as present and never as lost;
    the counts say how many of those acknowledged sends the history shows
    read. A message without a position is outside retention only when the
    history shows it read and the group's log was cut; otherwise its absence
    is a loss, as before.
    """
    out = Findings()
    by_id: dict[tuple[int, int, int], set[int]] = {}
    by_off = set()
    if found.num_rows:
        g = found.column("gid").to_pylist()
        p = found.column("producer_id").to_pylist()
        s = found.column("sequence").to_pylist()
        o = found.column("phys_offset").to_pylist()
        for a, b, c, d in zip(g, p, s, o, strict=True):
            if b != 0:
                by_id.setdefault((a, b, c), set()).add(d)
        by_off = set(zip(g, o, strict=True))
    stats = {"acked_sends": 0, "failed_sends": 0, "indeterminate_sends": 0, "consumed": 0,
             "acked_missing": 0, "acked_misplaced": 0, "consumed_missing": 0,
             "failed_present": 0,
             "indeterminate_present": 0, "unknown_group": 0,
             "acked_outside_retention": 0, "acked_outside_retention_read": 0,
             "consumed_outside_retention": 0}
    shown: dict[str, int] = {}
    severity: dict[str, str] = {}
    floors = retained_from or {}
    gaps = retained_away or {}

    def gid_of(m: HistMsg) -> int:
        return group_ids.get(m.group, -1) if m.group else (
            next(iter(group_ids.values())) if len(group_ids) == 1 else -1)

    def key(gid: int, m: HistMsg) -> tuple[int, int, int]:
        return (gid, m.producer_id, m.sequence) if m.producer_id != 0 else (
            gid, 0, m.phys_offset)

    # Messages the history shows consumed: proof they were in the log once.
    read = {key(g, m) for m in msgs if m.f == "poll" and m.type == "ok" and (g := gid_of(m)) >= 0}

    def present(gid: int, m: HistMsg) -> bool:
        if m.producer_id != 0:
            return (gid, m.producer_id, m.sequence) in by_id
        return m.phys_offset >= 0 and (gid, m.phys_offset) in by_off

    def outside(gid: int, m: HistMsg, was_read: bool) -> bool:
        """Absent because retention removed it from every replica (see above)."""
        floor = floors.get(gid, 0)
        if m.phys_offset >= 0:
            return m.phys_offset < floor or any(
                a <= m.phys_offset < b for a, b in gaps.get(gid, ()))
        return was_read and (floor > 0 or bool(gaps.get(gid)))

    def removed_at(gid: int, m: HistMsg) -> str:
        floor = floors.get(gid, 0)
        gap = next((g for g in gaps.get(gid, ()) if g[0] <= m.phys_offset < g[1]), None)
        if gap is not None and m.phys_offset >= floor:
            return f"in positions {gap[0]}..{gap[1]}, which retention removed from every replica"
        return f"below the retained log (position {floor} on)"

    def flag(kind: str, sev: str, gid: int, m: HistMsg, text: str) -> None:
        shown[kind] = shown.get(kind, 0) + 1
        severity[kind] = sev
        if shown[kind] <= max_examples:
            out.add("history", kind, sev, gid=gid, topic=m.topic, queue_id=m.queue,
                    slot=m.queue_offset, phys_offset=m.phys_offset,
                    detail=f"{m.file}:{m.line} op {m.op_index} ({m.type} {m.f} by {m.process} at "
                           f"{m.time_ns} ns) producer {m.producer_id & 0xFFFFFFFFFFFFFFFF:#x} "
                           f"seq {m.sequence}: {text}")

    for m in msgs:
        gid = gid_of(m)
        if gid < 0:
            stats["unknown_group"] += 1
            continue
        hit = present(gid, m)
        if m.f == "send" and m.type == "ok":
            stats["acked_sends"] += 1
            was_read = key(gid, m) in read
            if not hit and outside(gid, m, was_read):
                stats["acked_outside_retention"] += 1
                stats["acked_outside_retention_read"] += int(was_read)
                flag("acked_send_outside_retention", INFO, gid, m,
                     f"acknowledged, {'read, ' if was_read else 'never read, '}now "
                     f"{removed_at(gid, m)}: not verifiable")
            elif not hit:
                stats["acked_missing"] += 1
                flag("acked_send_missing", VIOLATION, gid, m, "acknowledged, not in the log")
            elif m.producer_id != 0 and m.phys_offset >= 0 and m.phys_offset not in by_id[
                    (gid, m.producer_id, m.sequence)]:
                # The ack's message id is the offset the message was stored at.
                stats["acked_misplaced"] += 1
                where = sorted(by_id[(gid, m.producer_id, m.sequence)])
                flag("acked_send_misplaced", VIOLATION, gid, m,
                     f"acknowledged at physical offset {m.phys_offset}, committed at "
                     + ", ".join(str(x) for x in where[:5]))
        elif m.f == "send" and m.type == "fail":
            stats["failed_sends"] += 1
            if hit and m.producer_id != 0:
                stats["failed_present"] += 1
                flag("failed_send_present", VIOLATION, gid, m,
                     "the send definitely failed, yet the message is committed")
        elif m.f == "send" and m.type == "info":
            stats["indeterminate_sends"] += 1
            stats["indeterminate_present"] += int(hit)
        elif m.f == "poll" and m.type == "ok":
            stats["consumed"] += 1
            if not hit and outside(gid, m, True):
                stats["consumed_outside_retention"] += 1
                flag("consumed_outside_retention", INFO, gid, m,
                     f"consumed, now {removed_at(gid, m)}")
            elif not hit:
                stats["consumed_missing"] += 1
                flag("consumed_missing", VIOLATION, gid, m, "consumed, not in the committed log")
    for kind, n in shown.items():
        if n > max_examples:
            out.add("history", kind, severity[kind], count=n - max_examples,
                    detail="further occurrences not listed")
    if stats["unknown_group"]:
        out.add("history", "unknown_group", INFO, count=stats["unknown_group"],
                detail="history messages of groups that were not audited")
    return out.table(), stats
