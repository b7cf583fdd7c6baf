"""The checker's self-test: a real history, mutated one way at a time, must be caught.

The history was recorded from real processes (see ``histories.REAL_RUN``) and
checks valid as recorded. Each mutant changes it the way a broken broker or
client would show up in a history (a lost, duplicated, reordered, phantom,
skipped or misplaced message, two values at one offset, a body that is not
the body sent) and must be reported under the named kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chaos.checker import check
from chaos.history import Op
from tests.chaos.histories import real_history

Mutant = Callable[[list[Op]], None]


def sends(ops: list[Op], type_: str = "ok") -> list[Op]:
    return [op for op in ops if op.f == "send" and op.type == type_]


def reads(ops: list[Op], *, drain: bool | None = None) -> list[tuple[Op, dict[str, Any]]]:
    """(poll op, message) of every read, the drain's only or the consumers' only."""
    out = []
    for op in ops:
        if op.f != "poll" or op.type != "ok":
            continue
        if drain is not None and bool(op.value.get("drain")) != drain:
            continue
        out += [(op, m) for m in op.value["messages"]]
    return out


def drop_reads(ops: list[Op], keep: Callable[[dict[str, Any]], bool], *,
               drain: bool | None = None) -> None:
    for op in ops:
        if op.f == "poll" and op.type == "ok" and (
                drain is None or bool(op.value.get("drain")) == drain):
            op.value["messages"] = [m for m in op.value["messages"] if keep(m)]


def the_ack(ops: list[Op], n: int = 100) -> dict[str, Any]:
    return sends(ops)[n].value


def lose(ops: list[Op]) -> None:
    """The drain no longer finds an acknowledged message (a consumer had read it)."""
    value = the_ack(ops)["value"]
    drop_reads(ops, lambda m: m["value"] != value, drain=True)


def lose_everywhere(ops: list[Op]) -> None:
    """An acknowledged message never read by anyone (and its slot with it)."""
    value = the_ack(ops)["value"]
    drop_reads(ops, lambda m: m["value"] != value)


def duplicate(ops: list[Op]) -> None:
    """The drain reads one value again at the end of its queue."""
    ack = the_ack(ops)
    end = max(m["offset"] for _, m in reads(ops) if m["queue"] == ack["queue"])
    drain = [op for op in ops if op.f == "poll" and op.value.get("drain")][-1]
    drain.value["messages"].append({**ack, "offset": end + 1})


def reorder(ops: list[Op]) -> None:
    """Two messages of one producer in one queue swap places in every read."""
    by_key: dict[tuple, list[dict]] = {}
    for op in sends(ops):
        by_key.setdefault((op.value["producer_id"], op.value["queue"]), []).append(op.value)
    first, second = next(v for v in by_key.values() if len(v) > 10)[5:7]
    where = {first["value"]: second["offset"], second["value"]: first["offset"]}
    for _, m in reads(ops):
        if m["value"] in where:
            m["offset"] = where[m["value"]]


def make_phantom(ops: list[Op]) -> None:
    """A send the client was told definitely failed, read all the same."""
    op = sends(ops)[50]
    op.type = "fail"
    op.error = "UnknownTopicError: mutated"


def make_unexpected(ops: list[Op]) -> None:
    """A read of a value nobody sent (at the end of its queue)."""
    ack = the_ack(ops)
    end = max(m["offset"] for _, m in reads(ops) if m["queue"] == ack["queue"])
    drain = [op for op in ops if op.f == "poll" and op.value.get("drain")][-1]
    drain.value["messages"].append({**ack, "value": 10**9, "producer_id": 0, "sequence": 0,
                                    "offset": end + 1})


def skip_slot(ops: list[Op]) -> None:
    """A queue offset in the middle of a queue nobody read."""
    ack = the_ack(ops)
    drop_reads(ops, lambda m: (m["queue"], m["offset"]) != (ack["queue"], ack["offset"]))


def two_values_at_one_offset(ops: list[Op]) -> None:
    """A consumer read another value at an acknowledged slot."""
    a, b = sends(ops)[10].value, sends(ops)[11].value
    for _, m in reads(ops, drain=False):
        if m["value"] == b["value"]:
            m.update(queue=a["queue"], offset=a["offset"])


def ack_far_away(ops: list[Op]) -> None:
    """An ack naming queue offset 10^6, read where it really is."""
    the_ack(ops)["offset"] = 10**6


def ack_wrong_queue(ops: list[Op]) -> None:
    """An ack naming another queue (same offset number)."""
    ack = the_ack(ops)
    ack["queue"] = (ack["queue"] + 1) % 4


def ack_neighbour_offset(ops: list[Op]) -> None:
    """An ack naming the next slot of its queue, which holds another value."""
    the_ack(ops)["offset"] += 1


def body_changed_on_read(ops: list[Op]) -> None:
    """The drain read a body whose CRC is not the CRC of the body sent (same value)."""
    value = the_ack(ops)["value"]
    for _, m in reads(ops, drain=True):
        if m["value"] == value:
            m["body_crc32c"] ^= 0x10


def body_length_changed(ops: list[Op]) -> None:
    """A consumer read a longer body under the sent identity."""
    value = the_ack(ops)["value"]
    for _, m in reads(ops, drain=False):
        if m["value"] == value:
            m["body_len"] += 1


def body_of_another_value(ops: list[Op]) -> None:
    """The identity (producer, sequence) of one send carrying another send's body."""
    a, b = the_ack(ops), the_ack(ops, 101)
    for _, m in reads(ops):
        if m["value"] == a["value"]:
            m.update(value=b["value"], body_crc32c=b["body_crc32c"], body_len=b["body_len"])


def digest_differs_at_send(ops: list[Op]) -> None:
    """The workload recorded one digest when sending; every read has another."""
    value = the_ack(ops)["value"]
    for op in ops:
        if op.f == "send" and op.value["value"] == value:
            op.value["body_crc32c"] ^= 1


# mutant -> the kind it must be reported as (alone, when the second item is True)
MUTANTS: dict[str, tuple[Mutant, str, bool]] = {
    "lost_after_consumed": (lose, "lost", False),
    "lost_never_read": (lose_everywhere, "lost", False),
    "duplicated": (duplicate, "duplicated", True),
    "reordered": (reorder, "order", False),
    "phantom": (make_phantom, "phantom", True),
    "unexpected": (make_unexpected, "unexpected", True),
    "skipped": (skip_slot, "skipped_offsets", False),
    "inconsistent_offsets": (two_values_at_one_offset, "inconsistent_offsets", False),
    "ack_offset_1e6": (ack_far_away, "misplaced_ack", True),
    "ack_wrong_queue": (ack_wrong_queue, "misplaced_ack", False),
    "ack_next_offset": (ack_neighbour_offset, "misplaced_ack", False),
    "body_crc_on_read": (body_changed_on_read, "body_mismatch", True),
    "body_len_on_read": (body_length_changed, "body_mismatch", True),
    "body_of_another_value": (body_of_another_value, "body_mismatch", False),
    "digest_at_send": (digest_differs_at_send, "body_mismatch", True),
}


def test_the_recorded_history_is_valid() -> None:
    result = check(real_history())
    assert result["valid"], result["counts"]
    assert result["sends"]["acknowledged"] == result["sends"]["attempted"] > 300
    assert result["reads"]["drain"] == result["sends"]["acknowledged"]


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_mutant_is_caught(name: str) -> None:
    mutate, kind, alone = MUTANTS[name]
    ops = real_history()
    mutate(ops)
    result = check(ops)
    assert not result["valid"], (name, result["counts"])
    assert kind in result["bad_kinds"], (name, result["counts"])
    if alone:
        assert result["bad_kinds"] == [kind], (name, result["counts"])
