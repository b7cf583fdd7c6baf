"""Reading client histories (``spark_audit.history.read_history``).

The audit checks every acknowledged send of a history against the committed
log. A line it cannot read is therefore refused, naming the file and line,
never skipped: the skipped line could be the acknowledged send that was
lost. Before 2026-12-06 a send whose value was not an object, or a message
with an unparseable msg_id, was skipped and the audit passed; an integer
past 2^63 stopped it without saying where.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_audit import history

SEND = {"index": 1, "time_ns": 5, "process": 0, "type": "ok", "f": "send",
        "value": {"topic": "t", "value": 1, "producer_id": 9, "sequence": 1,
                  "body_crc32c": 47693366, "body_len": 50, "attempts": 1, "group": "g",
                  "queue": 0, "offset": 0, "msg_id": "g@0000000000000311", "duplicate": False}}
POLL = {"index": 2, "time_ns": 6, "process": 1000, "type": "ok", "f": "poll",
        "value": {"epoch": 1, "messages": [dict(SEND["value"])]}}


def _write(tmp_path: Path, *ops: Any) -> str:
    path = tmp_path / "history.jsonl"
    path.write_text("".join((op if isinstance(op, str) else json.dumps(op)) + "\n"
                            for op in ops))
    return str(path)


def _with(op: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**op, "value": {**op["value"], **fields}}


def test_a_well_formed_history_names_every_message(tmp_path: Path) -> None:
    nemesis = {"index": 3, "time_ns": 7, "process": "nemesis", "type": "info", "f": "start",
               "value": {"nemesis": "kill"}}
    msgs, ops = history.read_history([_write(tmp_path, SEND, POLL, nemesis, "",
                                             _with(SEND, producer_id=(1 << 64) - 1))])
    assert ops == 4 and len(msgs) == 3
    assert msgs[0].phys_offset == 0x311 and msgs[0].group == "g" and msgs[0].body_crc == 47693366
    assert msgs[2].producer_id == -1  # u64 stored as the int64 with the same bits


@pytest.mark.parametrize(("op", "message"), [
    ("not json", "not JSON"),
    ("[" * 100_000, "nested deeper"),
    ("[1, 2]", "not a JSON object but list"),
    ({**SEND, "value": [1, 2]}, "value is not an object"),
    ({**SEND, "value": None}, "value is not an object"),
    ({**SEND, "type": "done"}, "type 'done' is not invoke, ok, fail or info"),
    ({**POLL, "value": {"messages": {"a": 1}}}, "messages is not a list"),
    ({**POLL, "value": {"messages": [7]}}, "message 0 is not an object"),
    (_with(SEND, offset=1 << 70), "offset 1180591620717411303424 is not an integer"),
    (_with(SEND, offset=-5), "offset -5 is not an integer"),
    (_with(SEND, offset=1.5), "offset 1.5 is not an integer"),
    (_with(SEND, offset=True), "offset True is not an integer"),
    (_with(SEND, queue=1 << 32), "queue 4294967296 is not an integer"),
    (_with(SEND, producer_id=1 << 64), "producer_id 18446744073709551616"),
    (_with(SEND, sequence="1"), "sequence '1' is not an integer"),
    (_with(SEND, body_crc32c=1 << 32), "body_crc32c 4294967296"),
    (_with(SEND, topic=5), "topic 5 is not a string"),
    (_with(SEND, msg_id="g@zzzz"), "msg_id 'g@zzzz' is not <group>@<16 hex digits>"),
    (_with(SEND, msg_id="g@" + "f" * 40), "is not <group>@<16 hex digits>"),
    (_with(SEND, msg_id="g@FFFFFFFFFFFFFFFF"), "naming an offset up to 2^63-1"),
    (_with(SEND, msg_id="@0000000000000311"), "is not <group>@<16 hex digits>"),
    ({**SEND, "time_ns": "x"}, "time_ns 'x' is not an integer"),
])
def test_a_malformed_line_is_refused_with_its_file_and_line(tmp_path: Path, op: Any,
                                                            message: str) -> None:
    path = _write(tmp_path, SEND, POLL, op)
    with pytest.raises(ValueError) as err:
        history.read_history([path])
    assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(json.dumps(SEND).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(ValueError, match=r"history.jsonl:2: 'utf-8' codec"):
        history.read_history([str(path)])


def test_a_line_longer_than_any_history_has_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with path.open("wb") as fh:
        fh.write(json.dumps(SEND).encode() + b"\n")
        fh.write(b" " * (history.LINE_BYTES_MAX + 10))  # no newline: the reader stops at the limit
    with pytest.raises(ValueError, match=r"history.jsonl:2: a line of more than 16777216 bytes"):
        history.read_history([str(path)])


def test_a_file_with_no_newline_at_all_is_refused_not_read_to_the_end() -> None:
    """`--history /dev/zero` (a wrong path) raised MemoryError after eating the RAM."""
    with pytest.raises(ValueError, match=r"/dev/zero:1: a line of more than"):
        history.read_history(["/dev/zero"])


def test_a_poll_of_thousands_of_messages_fits_in_a_line(tmp_path: Path) -> None:
    messages = [dict(SEND["value"], sequence=k) for k in range(1, 5001)]
    msgs, ops = history.read_history([_write(tmp_path, {**POLL, "value": {"epoch": 1,
                                                                          "messages": messages}})])
    assert ops == 1 and len(msgs) == 5000
