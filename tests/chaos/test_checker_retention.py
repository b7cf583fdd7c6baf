"""The checker with retention on: unread acknowledged messages are `expired`
only where the drain was told they had been deleted; every other one is lost.

Hand-built histories first (each rule of chaos.moved), then the recorded real
history turned into a retention run (its drain answered "moved forward" over
the first third of every queue), then mutants of the checker itself: a
checker that excuses too much or too little must fail one of these cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import chaos.checker as checker_module
from chaos.checker import check
from chaos.history import Op
from chaos.moved import Ack, MovedRanges, OffsetBounds, expiry, moves_of
from tests.chaos.histories import Builder, real_history

DRAIN = "drain"


def retained(floor: int = 6, n: int = 10, *, missing: tuple[int, ...] = ()) -> Builder:
    """Sends 0..n-1 to queue 0 at offsets 0..n-1, all consumed live; the drain
    is moved from 0 to `floor` and reads the rest (but `missing`)."""
    b = Builder()
    for i in range(n):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(i, 0, i) for i in range(n)])
    b.moved(DRAIN, 0, 0, floor, drain=True)
    b.poll(DRAIN, [(i, 0, i) for i in range(floor, n) if i not in missing], drain=True)
    return b


def counts(ops: list[Op], **kw: Any) -> dict[str, int]:
    return check(ops, retention=True, **kw)["counts"]


# ------------------------------------------------------------ hand-built


def test_messages_the_drain_was_told_were_deleted_are_expired_not_lost() -> None:
    result = check(retained().ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == 6 and result["counts"]["lost"] == 0
    assert result["counts"]["moved_forward"] == 1
    assert result["retention"]["expired_read_live"] == 6
    assert result["retention"]["drain_floor"] == {"g/t/0": 6}
    first = result["examples"]["expired"][0]
    assert first["value"] == 0 and first["offset"] == 0 and first["read_live"] is True


def test_a_missing_message_inside_retention_is_lost() -> None:
    """Offset 8 is above where the drain was moved to (6) and below the
    highest offset read (9): still retained when read, and missing."""
    result = check(retained(missing=(8,)).ops, retention=True)
    assert "lost" in result["bad_kinds"]  # (and the drain's own step over 8: a skip)
    assert result["counts"]["lost"] == 1 and result["counts"]["expired"] == 6
    assert result["examples"]["lost"][0]["offset"] == 8


def test_the_last_message_missing_is_lost_too() -> None:
    result = check(retained(missing=(9,)).ops, retention=True)
    assert result["counts"]["lost"] == 1 and result["examples"]["lost"][0]["offset"] == 9


def test_a_message_nobody_ever_read_below_the_floor_is_expired_and_says_so() -> None:
    b = Builder()
    for i in range(4):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(2, 0, 2), (3, 0, 3)])
    b.moved(10, 0, 0, 2)  # the consumer came late too
    b.moved(DRAIN, 0, 0, 2, drain=True)
    b.poll(DRAIN, [(2, 0, 2), (3, 0, 3)], drain=True)
    result = check(b.ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == 2
    assert result["retention"]["expired_read_live"] == 0
    assert {e["read_live"] for e in result["examples"]["expired"]} == {False}


def test_without_retention_a_moved_answer_is_a_violation_and_excuses_nothing() -> None:
    result = check(retained().ops)
    assert set(result["bad_kinds"]) == {"lost", "moved_without_retention"}
    assert result["counts"]["lost"] == 6 and result["counts"]["expired"] == 0


def test_only_the_drain_judges_when_there_is_one() -> None:
    """A consumer told [0, 3) was deleted does not excuse messages the drain
    read from 0 without being moved: it should have found them."""
    b = Builder()
    for i in range(6):
        b.send(1, i, queue=0, offset=i)
    b.moved(10, 0, 0, 3)
    b.poll(10, [(i, 0, i) for i in range(3, 6)])
    b.poll(DRAIN, [(i, 0, i) for i in range(3, 6)], drain=True)
    c = counts(b.ops)
    assert c["lost"] == 3 and c["expired"] == 0
    assert c["skipped_offsets"] == 0  # a reader was told they were gone: not a skip


def test_a_drain_moved_only_on_another_queue_excuses_nothing_here() -> None:
    b = Builder()
    b.send(1, 0, queue=0, offset=0)
    b.send(1, 1, queue=1, offset=0)
    b.send(1, 2, queue=1, offset=1)
    b.moved(DRAIN, 1, 0, 1, drain=True)
    b.poll(DRAIN, [(2, 1, 1)], drain=True)
    c = counts(b.ops)
    assert c["expired"] == 1 and c["lost"] == 1  # value 0 in queue 0: never excused


def test_without_a_drain_every_reader_judges() -> None:
    b = Builder()
    for i in range(5):
        b.send(1, i, queue=0, offset=i)
    b.moved(10, 0, 0, 2)
    b.poll(10, [(2, 0, 2), (4, 0, 4)])
    c = counts(b.ops)
    assert c["expired"] == 2 and c["lost"] == 1  # offset 3: nobody was told it was gone


def test_a_consumer_may_jump_across_what_it_was_told_was_deleted() -> None:
    b = Builder()
    for i in range(8):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(0, 0, 0), (1, 0, 1)])
    b.moved(10, 0, 2, 5)
    b.poll(10, [(i, 0, i) for i in range(5, 8)])
    b.moved(DRAIN, 0, 0, 5, drain=True)
    b.poll(DRAIN, [(i, 0, i) for i in range(5, 8)], drain=True)
    result = check(b.ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == 5  # the drain was moved over 0..4
    assert result["retention"]["expired_read_live"] == 2  # 2..4: never read by anyone


def test_a_jump_is_excused_only_by_this_reader_between_the_two_reads() -> None:
    b = Builder()
    for i in range(8):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(0, 0, 0), (1, 0, 1)])
    b.moved(11, 0, 2, 5)                      # another consumer's answer
    b.poll(10, [(5, 0, 5)])                   # 10 skips 2..4 without being told
    b.poll(12, [(0, 0, 0), (1, 0, 1)])
    b.poll(12, [(5, 0, 5)])                   # 12 skips first ...
    b.moved(12, 0, 2, 5)                      # ... and is told afterwards
    b.moved(DRAIN, 0, 0, 5, drain=True)
    b.poll(DRAIN, [(i, 0, i) for i in range(5, 8)], drain=True)
    result = check(b.ops, retention=True)
    assert result["counts"]["skipped_offsets"] == 2
    assert {e["process"] for e in result["examples"]["skipped_offsets"]} == {10, 12}


def test_a_jump_wider_than_the_answer_is_a_skip() -> None:
    b = Builder()
    for i in range(8):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(0, 0, 0)])
    b.moved(10, 0, 1, 3)
    b.poll(10, [(5, 0, 5)])                   # told [1, 3) went, skipped 3 and 4 too
    b.moved(DRAIN, 0, 0, 3, drain=True)
    b.poll(DRAIN, [(i, 0, i) for i in range(3, 8)], drain=True)
    c = counts(b.ops)
    assert c["skipped_offsets"] == 1 and c["lost"] == 0


# ------------------------------------------------------------ unknown offsets


def unknown_offset(floor: int, at: int | None) -> Builder:
    """Queue 0 holds offsets 0..10: value j at offset j, except that offset
    `at` holds value 100, acknowledged without an offset (replicate=async);
    `at` None: 100 is sent last, after offset 10. Nobody reads 100; the
    drain is moved from 0 to `floor` and reads the rest."""
    b = Builder()
    for offset in range(11):
        if offset == at:
            b.send(1, 100, queue=0, offset=None)
        else:
            b.send(1, offset, queue=0, offset=offset)
    if at is None:
        b.send(1, 100, queue=0, offset=None)
    b.moved(DRAIN, 0, 0, floor, drain=True)
    b.poll(DRAIN, [(o, 0, o) for o in range(floor, 11) if o != at], drain=True)
    return b


def test_an_unread_ack_without_an_offset_is_placed_by_real_time_order() -> None:
    # Between the sends at offsets 2 and 4, the drain moved to 6: deleted.
    result = check(unknown_offset(6, 3).ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == 6 and result["counts"]["expired_unknown"] == 0
    placed = next(e for e in result["examples"]["expired"] if e["value"] == 100)
    assert placed.get("between") == [2, 4] and placed["offset"] is None
    # Between offsets 7 and 9, above the floor: it was retained and is missing.
    c = counts(unknown_offset(6, 8).ops)
    assert c["lost"] == 1 and c["expired"] == 6 and c["expired_unknown"] == 0


def test_an_ack_without_an_offset_after_the_last_known_one() -> None:
    # After offset 10 with nothing known after it; the drain was moved only
    # to 6, so wherever it is, it was retained: lost.
    c = counts(unknown_offset(6, None).ops)
    assert c["lost"] == 1 and c["expired_unknown"] == 0
    # The drain was moved past everything known (to 12): some of its possible
    # offsets were deleted, maybe not all: counted apart, never as expired.
    result = check(unknown_offset(12, None).ops, retention=True)
    assert result["counts"]["expired_unknown"] == 1
    assert result["counts"]["lost"] == 0 and result["counts"]["expired"] == 11
    assert result["retention"]["expired_unknown"] == 1


def test_an_unknown_offset_read_live_is_judged_where_it_was_read() -> None:
    b = unknown_offset(12, None)
    b.poll(10, [(100, 0, 11)])  # a consumer read it at 11 before retention deleted it
    c = counts(b.ops)
    assert c["expired"] == 12 and c["expired_unknown"] == 0 and c["lost"] == 0


def test_offset_bounds_and_no_room_between_neighbours() -> None:
    q = ("g", "t", 0)
    known = [Ack(1, "t", q, 4, 0, 1), Ack(2, "t", q, 5, 6, 7)]
    squeezed = Ack(3, "t", q, None, 2, 3)  # after 4's ack, before 5's invoke: no offset left
    assert OffsetBounds(known).between(squeezed) == (4, 5)
    ranges = MovedRanges(m for m in ())
    assert expiry(squeezed, ranges, OffsetBounds(known))[0] == "lost"


def test_moved_ranges_merge_and_cover() -> None:
    ops = retained(floor=3).ops
    b = Builder()
    b.moved(DRAIN, 0, 2, 5, drain=True)
    b.moved(DRAIN, 0, 5, 7, drain=True)
    b.moved(DRAIN, 0, 9, 9, drain=True)  # not forward: ignored
    ranges = MovedRanges(moves_of([*ops, *b.ops]))
    q = ("g", "t", 0)
    assert ranges.covers_all(q, 0, 7) and not ranges.covers_all(q, 0, 8)
    assert ranges.floor(q) == 7
    assert not ranges.covers(q, 7) and ranges.covers_any(q, 6, None)
    assert not ranges.covers_any(q, 7, None)


# ------------------------------------------------------------ the real history


def retention_of(ops: list[Op], fraction: float = 1 / 3) -> tuple[list[Op], dict[int, int]]:
    """The recorded history as a retention run would show it: the drain is
    answered "moved forward" from 0 to a third of each queue's end, and no
    longer reads what lies below. Returns the history and the floors."""
    ends: dict[int, int] = {}
    for op in ops:
        if op.f == "poll" and op.value.get("drain"):
            for m in op.value["messages"]:
                ends[m["queue"]] = max(ends.get(m["queue"], 0), m["offset"] + 1)
    floors = {q: int(end * fraction) for q, end in ends.items()}
    first = next(i for i, op in enumerate(ops) if op.f == "poll" and op.value.get("drain"))
    drain = ops[first]
    moves = [Op(drain.process, "ok", "moved", {"topic": "chaos", "group": "chaos", "queue": q,
                                               "from": 0, "to": f, "min_offset": f,
                                               "drain": True}, drain.time_ns)
             for q, f in sorted(floors.items())]
    out = [*ops[:first], *moves, *ops[first:]]
    for i, op in enumerate(out):
        op.index = i
        if op.f == "poll" and op.value.get("drain"):
            op.value["messages"] = [m for m in op.value["messages"]
                                    if m["offset"] >= floors[m["queue"]]]
    return out, floors


def test_the_recorded_history_with_retention_is_valid_and_counts_what_expired() -> None:
    ops, floors = retention_of(real_history())
    result = check(ops, retention=True)
    assert result["valid"], result["counts"]
    assert result["counts"]["expired"] == sum(floors.values()) > 50
    assert result["counts"]["lost"] == 0
    assert result["retention"]["drain_floor"] == {f"chaos/chaos/{q}": f
                                                  for q, f in floors.items()}


def drained_slot(ops: list[Op], floors: dict[int, int], above: int) -> tuple[int, int]:
    """A (queue, offset) the drain read, `above` offsets over its queue's floor."""
    q = min(floors)
    return q, floors[q] + above


@pytest.mark.parametrize("above", [0, 1, 10])
def test_a_drained_message_inside_retention_removed_from_the_history_is_lost(
        above: int) -> None:
    ops, floors = retention_of(real_history())
    q, offset = drained_slot(ops, floors, above)
    for op in ops:
        if op.f == "poll" and op.value.get("drain"):
            op.value["messages"] = [m for m in op.value["messages"]
                                    if (m["queue"], m["offset"]) != (q, offset)]
    result = check(ops, retention=True)
    assert "lost" in result["bad_kinds"], result["counts"]
    assert result["counts"]["lost"] == 1 and result["counts"]["expired"] == sum(floors.values())


def test_a_move_over_messages_the_drain_read_does_not_count_them_expired() -> None:
    """The drain read [floor, end) but its moves claim [0, end + 1000): what
    it read is read, not expired; expired stays the count below the floor."""
    ops, floors = retention_of(real_history())
    for op in ops:
        if op.f == "moved":
            op.value["to"] += 1000
    result = check(ops, retention=True)
    assert result["counts"]["expired"] == sum(floors.values())
    assert result["counts"]["lost"] == 0


# ------------------------------------------------------------ mutants of the checker


def _where(ack: Ack) -> dict[str, Any]:
    return {"queue": list(ack.queue) if ack.queue else None, "offset": ack.offset}


def _judge_below_max(outcome: dict[int, str], final: set[int], acks: dict[int, Any],
                     acked_at: dict[int, Any], seen: Any, judging: Any, attempted: Any,
                     seen_values: Any, out: Any) -> int:
    """Mutant: an unread ack below the highest offset read in its queue is expired."""
    highest: dict[Any, int] = {}
    for s in seen:
        highest[s.queue] = max(highest.get(s.queue, -1), s.offset)
    for value, kind in outcome.items():
        if kind != "ok" or value in final:
            continue
        queue, offset = acked_at.get(value, (acks[value][0], None))
        below = offset is not None and offset < highest.get(queue, -1)
        out.add("expired" if below else "lost", {"value": value, "queue": queue,
                                                 "offset": offset, "read_live": True})
    return 0


def _expiry_never(ack: Ack, ranges: MovedRanges, bounds: OffsetBounds
                  ) -> tuple[str, dict[str, Any]]:
    """Mutant: moved-forward ranges ignored, every unread ack is lost."""
    return "lost", _where(ack)


def _expiry_anything_moved(ack: Ack, ranges: MovedRanges, bounds: OffsetBounds
                           ) -> tuple[str, dict[str, Any]]:
    """Mutant: any moved answer on the queue excuses every unread ack in it."""
    return ("expired" if ack.queue in ranges.queues() else "lost"), _where(ack)


class _NoRanges(MovedRanges):
    """Mutant: readers' moves excuse nothing (coverage, order, expiry)."""

    def __init__(self, moves: Any) -> None:
        super().__init__(())


def _all_moves_judge(ops: Any) -> Any:
    """Mutant: every reader's move counts as the drain's."""
    return [dataclasses.replace(m, drain=True) for m in moves_of(ops)]


MUTANTS: dict[str, tuple[str, Callable[..., Any]]] = {
    "excuses_below_max_offset": ("_judge_unread", _judge_below_max),
    "ignores_moved_ranges": ("expiry", _expiry_never),
    "excuses_a_whole_moved_queue": ("expiry", _expiry_anything_moved),
    "moves_excuse_nothing": ("MovedRanges", _NoRanges),
    "any_reader_judges": ("moves_of", _all_moves_judge),
}

CASES: list[Callable[[], None]] = [
    test_messages_the_drain_was_told_were_deleted_are_expired_not_lost,
    test_a_missing_message_inside_retention_is_lost,
    test_the_last_message_missing_is_lost_too,
    test_only_the_drain_judges_when_there_is_one,
    test_a_consumer_may_jump_across_what_it_was_told_was_deleted,
    test_an_unread_ack_without_an_offset_is_placed_by_real_time_order,
    test_the_recorded_history_with_retention_is_valid_and_counts_what_expired,
]


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_checker_mutant_fails_a_case(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    attribute, replacement = MUTANTS[name]
    monkeypatch.setattr(checker_module, attribute, replacement)
    failed = []
    for case in CASES:
        try:
            case()
        except AssertionError:
            failed.append(case.__name__)
    assert failed, f"mutant {name} passed every case"
