"""Applying a few records from their heads as Python tuples (the plain-Python
scan's `rows`) gives the state and ConsumeQueue units the numpy path gives."""

from __future__ import annotations

import gc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import (
    HEADER_SIZE,
    KIND_MESSAGES,
    CommitLog,
    CommitLogConfig,
    Entry,
    Message,
    encode_messages,
)
from commitlog.columns import PYTHON_SCAN_MAX, scan_body
from consumequeue.store import ConsumeQueueStore, encoded_units_by_queue, units_by_queue
from ledgermq.broker.state import BrokerState

_message = st.builds(
    Message,
    topic=st.sampled_from(["t", "u"]),
    body=st.binary(max_size=20),
    queue_id=st.integers(0, 2),
    tags=st.sampled_from(["", "a", "b"]),
    producer_id=st.sampled_from([0, 7, 9]),
    sequence=st.integers(1, 40),
)
# Entries of 1..PYTHON_SCAN_MAX records, several in a row (so sequences can
# repeat, go down, or interleave producers as a retry or a merge makes them).
_entries = st.lists(st.lists(_message, min_size=1, max_size=PYTHON_SCAN_MAX),
                    min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(_entries)
def test_state_from_rows_equals_state_from_numpy_columns(batches: list[list[Message]]) -> None:
    by_rows, by_numpy = BrokerState(), BrokerState()
    position = 0
    for index, messages in enumerate(batches, 1):
        body = encode_messages(messages, 1 << 20)
        entry = Entry(index, 1, KIND_MESSAGES, position, body)
        position += HEADER_SIZE + len(body)
        small, large = scan_body(body), scan_body(body, python_max=0)
        assert small.rows is not None and large.rows is None
        applied_rows = by_rows.apply(entry, small)
        applied_numpy = by_numpy.apply(entry, large)
        assert list(applied_rows) == list(applied_numpy)
    assert by_rows.queue_next == by_numpy.queue_next
    for producer_id in (7, 9):
        assert by_rows.producers.high(producer_id) == by_numpy.producers.high(producer_id)
        for sequence in range(1, 41):
            assert by_rows.producers.lookup(producer_id, sequence) == \
                by_numpy.producers.lookup(producer_id, sequence)
    # The snapshot encodes every remembered location through the applied columns.
    assert by_rows.to_snapshot() == by_numpy.to_snapshot()


@settings(max_examples=100, deadline=None)
@given(st.lists(_message, min_size=1, max_size=PYTHON_SCAN_MAX), st.integers(0, 1 << 20))
def test_units_from_rows_equal_units_from_numpy(messages: list[Message], position: int) -> None:
    body = encode_messages(messages, 1 << 20)
    entry = Entry(3, 1, KIND_MESSAGES, position, body)
    small = scan_body(body)
    assert small.rows is not None
    expected = [(key, units.tobytes(), len(units))
                for key, units in units_by_queue(entry, scan_body(body, python_max=0))]
    assert encoded_units_by_queue(entry, small) == expected


def test_dispatch_of_small_and_large_entries_writes_the_same_queues(tmp_path: Path) -> None:
    """One ConsumeQueue store fed small entries through their rows, another the
    same entries through numpy columns: the same units in every queue."""
    bodies = [encode_messages([Message("t", b"m%d" % i, queue_id=i % 3, tags="x" * (i % 2))
                               for i in range(n)], 1 << 20) for n in (1, 3, 8, 1, 2)]
    stores = []
    for name, python_max in (("rows", PYTHON_SCAN_MAX), ("numpy", 0)):
        log = CommitLog.open(str(tmp_path / name), CommitLogConfig(segment_size_bytes=1 << 20))
        entries, position = [], 0
        for i, body in enumerate(bodies, 1):
            entries.append(Entry(i, 1, KIND_MESSAGES, position, body))
            position += HEADER_SIZE + len(body)
        log.append(entries)
        entries = log.read_entries(1, len(bodies) + 1, 1 << 30)
        store = ConsumeQueueStore(str(tmp_path / name), log)
        store.dispatch(entries, [scan_body(e.body, python_max) for e in entries])
        stores.append((store, log))
    (rows_store, _), (numpy_store, _) = stores
    assert sorted(rows_store.queues) == sorted(numpy_store.queues)
    for key, queue in rows_store.queues.items():
        other = numpy_store.queues[key]
        assert queue.max_offset == other.max_offset > 0
        assert queue.read(0, 100) == other.read(0, 100)
    for store, log in stores:
        store.close()
        log.close()


def test_remembered_locations_leave_the_cyclic_collectors_walk() -> None:
    """The producers' dedup windows hold tens of thousands of locations; once
    collected, none of them (nor the entry columns they share) is tracked by
    the cyclic collector, so a full collection does not walk them. Lookups
    and the snapshot still resolve every one."""
    state = BrokerState()
    position, entry_index = 0, 0
    for index in range(1, 41):
        # Per entry: 50 records of producer 7 (numpy path), then 3 of
        # producers 7 and 9 (rows path), interleaved.
        messages = [Message(topic="t", body=b"x", queue_id=k % 3, producer_id=7,
                            sequence=index * 100 + k) for k in range(50)]
        mixed = [Message(topic="u", body=b"y", queue_id=1, producer_id=p,
                         sequence=index * 100 + 60 + k) for k, p in enumerate((9, 7, 9))]
        for batch in (messages, mixed):
            body = encode_messages(batch, 1 << 20)
            entry_index += 1
            entry = Entry(entry_index, 1, KIND_MESSAGES, position, body)
            position += HEADER_SIZE + len(body)
            state.apply(entry, scan_body(body))
    # One collection (of the youngest generation, where the latest pairs
    # are) untracks every pair, whatever order the collector meets them in.
    gc.collect(0)
    windows = [p.recent for p in state.producers._producers.values()]
    assert sum(map(len, windows)) == 40 * 53
    tracked = [loc for recent in windows for loc in recent.values() if gc.is_tracked(loc)]
    assert tracked == []
    stored = state.producers.lookup(7, 3_149)  # entry 31, record 49
    assert stored[0] and stored[1] is not None and stored[1].topic == "t"
    assert stored[1].queue_id == 49 % 3
    assert state.producers.lookup(9, 1_062)[1].topic == "u"  # type: ignore[union-attr]
    # A restored window is held the same way, as one producer's columns:
    # the same lookups, nothing tracked, and the same snapshot bytes again.
    restored = BrokerState.from_snapshot(state.to_snapshot())
    for producer_id, sequence in ((7, 3_149), (9, 1_062), (7, 4_061)):
        assert restored.producers.lookup(producer_id, sequence) == \
            state.producers.lookup(producer_id, sequence)
    gc.collect(0)
    assert not [loc for p in restored.producers._producers.values()
                for loc in p.recent.values() if gc.is_tracked(loc)]
    assert restored.to_snapshot() == state.to_snapshot()
