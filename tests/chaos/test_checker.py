"""The checker on hand-built histories: one clean run, then each anomaly it must find."""

from __future__ import annotations

from chaos.checker import VIOLATIONS, check
from tests.chaos.histories import Builder


def clean() -> Builder:
    b = Builder()
    for i in range(6):
        b.send(1, i, queue=i % 2, offset=i // 2)
    b.poll(10, [(0, 0, 0), (2, 0, 1), (4, 0, 2)])
    b.poll(11, [(1, 1, 0), (3, 1, 1), (5, 1, 2)])
    return b


def test_a_clean_history_is_valid() -> None:
    result = check(clean().ops)
    assert result["valid"], result
    assert all(result["counts"][k] == 0 for k in VIOLATIONS)
    assert result["sends"] == {"attempted": 6, "acknowledged": 6, "failed": 0, "unknown": 0,
                               "unknown_seen": 0}


def test_lost_acknowledged_message() -> None:
    b = clean()
    b.send(1, 99, queue=0, offset=3)
    result = check(b.ops)
    assert not result["valid"] and result["counts"]["lost"] == 1
    assert result["examples"]["lost"][0]["value"] == 99
    assert result["bad_kinds"] == ["lost"]


def test_unknown_sends_are_never_lost() -> None:
    b = clean()
    b.send(1, 50, "info")
    b.send(2, 51, "info")
    b.poll(10, [(51, 0, 3)])
    result = check(b.ops)
    assert result["valid"], result
    assert result["counts"]["unknown"] == 2 and result["counts"]["recovered"] == 1
    assert result["sends"]["unknown_seen"] == 1


def test_an_invoke_without_completion_is_unknown() -> None:
    b = clean()
    b.h.record(1, "invoke", "send", {"topic": "t", "value": 77})
    result = check(b.ops)
    assert result["valid"] and result["counts"]["unknown"] == 1


def test_unexpected_and_phantom() -> None:
    b = clean()
    b.send(1, 60, "fail")
    b.poll(10, [(60, 0, 3), (1234, 0, 4)])
    result = check(b.ops)
    assert result["counts"]["unexpected"] == 1 and result["counts"]["phantom"] == 1
    assert result["counts"]["duplicated"] == 0
    assert {"unexpected", "phantom"} <= set(result["bad_kinds"])


def test_redelivery_is_not_duplication() -> None:
    b = clean()
    b.poll(12, [(0, 0, 0), (2, 0, 1)])
    result = check(b.ops)
    assert result["valid"] and result["counts"]["redelivered"] == 2


def test_duplicates_split_by_producer_retries() -> None:
    b = clean()
    b.send(1, 70, queue=0, offset=3, attempts=3)  # retried: an idempotence miss
    b.send(1, 71, queue=0, offset=5)              # one clean attempt: the broker's doing
    b.poll(10, [(70, 0, 3), (70, 0, 4), (71, 0, 5), (71, 0, 6)])
    result = check(b.ops)
    assert result["counts"]["retry_duplicated"] == 1
    assert result["counts"]["duplicated"] == 1
    assert result["bad_kinds"] == ["duplicated"]
    assert not check(b.ops, strict_idempotence=True)["valid"]


def test_two_values_at_one_offset() -> None:
    b = clean()
    b.send(1, 80, queue=0, offset=3)
    b.poll(10, [(81, 0, 3)])  # the ack said 80 is at 3; a read found 81 there
    result = check(b.ops)
    assert result["counts"]["inconsistent_offsets"] == 1
    assert result["counts"]["lost"] == 1 and result["counts"]["unexpected"] == 1


def test_skipped_offsets_within_a_poll_and_never_read() -> None:
    b = Builder()
    for i in range(3):
        b.send(1, i, queue=0, offset=i)
    b.poll(10, [(0, 0, 0), (2, 0, 2)])
    result = check(b.ops)
    assert result["counts"]["skipped_offsets"] == 2  # the in-poll jump + offset 1 never read
    assert result["counts"]["lost"] == 1


def test_backward_offsets_without_rebalance_only() -> None:
    b = clean()
    b.poll(10, [(0, 0, 0)])
    result = check(b.ops)
    assert result["counts"]["backward_offsets"] == 1
    assert result["valid"]  # re-delivery, which at-least-once allows: reported only

    b = clean()
    b.poll(10, [(0, 0, 0)], epoch=1)  # after a rebalance: an allowed reset
    result = check(b.ops)
    assert result["valid"] and result["counts"]["rebalance_resets"] == 1


def test_order_violation_of_a_sequential_producer() -> None:
    b = Builder()
    b.send(1, 1, queue=0)  # acks without offsets (replicate=async)
    b.send(1, 2, queue=0)
    b.poll(10, [(2, 0, 0), (1, 0, 1)])
    result = check(b.ops)
    assert result["counts"]["order"] == 1
    assert result["bad_kinds"] == ["order"]


def test_nemesis_ops_are_ignored_by_the_checker() -> None:
    b = clean()
    b.nemesis("start", "kill")
    b.nemesis("stop", "kill")
    assert check(b.ops)["valid"]


def test_lost_is_judged_by_the_drain() -> None:
    b = Builder()
    b.send(1, 1, queue=0, offset=0)
    b.send(1, 2, queue=0, offset=1)
    b.poll(10, [(1, 0, 0), (2, 0, 1)])          # consumed live ...
    b.poll("drain", [(1, 0, 0)], drain=True)   # ... but 2 is gone when the drain reads
    result = check(b.ops)
    assert result["counts"]["lost"] == 1 and result["counts"]["lost_after_consumed"] == 1
    assert result["examples"]["lost"][0] == {"value": 2, "queue": ["g", "t", 0], "offset": 1,
                                             "consumed_before_loss": True, "topic": "t",
                                             "producer_id": 1, "sequence": 2}


def test_an_ack_must_name_where_the_value_was_read() -> None:
    b = clean()
    b.send(1, 90, queue=0, offset=1_000_000)  # the ack names an offset far past the queue
    b.send(1, 91, queue=1, offset=3)          # the ack names queue 1; it was read in queue 0
    b.poll(10, [(90, 0, 3), (91, 0, 4)])
    result = check(b.ops)
    assert result["bad_kinds"] == ["misplaced_ack"]
    assert result["counts"]["misplaced_ack"] == 2
    first = result["examples"]["misplaced_ack"][0]
    assert first == {"value": 90, "acked_at": ["g", "t", 0, 1_000_000],
                     "read_at": [["g", "t", 0, 3]]}


def test_a_read_body_must_be_the_body_sent_under_that_identity() -> None:
    b = clean()
    b.send(1, 95, queue=0, offset=3, producer=7, body_crc=0xAAAA)
    b.send(1, 96, queue=0, offset=4, producer=7, body_crc=0xBBBB)
    # 95's record carries its identity and the right CRC; 96's carries its identity
    # but a body with another CRC.
    b.poll(10, [(95, 0, 3), (96, 0, 4)], identity={95: (7, 95), 96: (7, 96)},
           body_crc={95: 0xAAAA, 96: 0xBBBC})
    result = check(b.ops)
    assert result["bad_kinds"] == ["body_mismatch"]
    (example,) = result["examples"]["body_mismatch"]
    assert (example["sequence"], example["differs"]) == (96, ["body_crc32c"])
    # A read without a recorded CRC (an older history) is compared by value only.
    b = clean()
    b.send(1, 95, queue=0, offset=3, producer=7, body_crc=0xAAAA)
    b.poll(10, [(95, 0, 3)], identity={95: (7, 95)})
    assert check(b.ops)["valid"]


def test_a_completion_without_its_invoke_makes_the_history_invalid() -> None:
    """An acknowledgement that pairs with no send cannot be judged: the
    checker says the history is inconsistent instead of dropping it."""
    b = clean()
    b.h.record(3, "ok", "send", {"topic": "t", "value": 88, "group": "g", "queue": 0,
                                 "offset": 9})
    result = check(b.ops)
    assert not result["valid"] and result["bad_kinds"] == ["orphan_completion"]
    assert result["examples"]["orphan_completion"][0]["value"]["value"] == 88
    # A second completion of one invoke is an orphan too.
    b = clean()
    b.send(1, 40, queue=0, offset=3)
    b.h.record(1, "ok", "send", {"topic": "t", "value": 40, "group": "g", "queue": 0,
                                 "offset": 3})
    b.poll(10, [(40, 0, 3)])
    assert check(b.ops)["bad_kinds"] == ["orphan_completion"]
