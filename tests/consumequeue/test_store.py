"""ConsumeQueues: dispatch of committed entries, lookups and recovery."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_support import SMALL

from commitlog import (
    KIND_CONTROL,
    KIND_MESSAGES,
    CommitLog,
    Message,
    decode_messages,
    encode_messages,
    tag_hash,
)
from consumequeue import ConsumeQueueStore

KEYS = [("A", 0), ("A", 1), ("B", 0), ("B", 2)]


def _batch(log: CommitLog, seq: int, keys: list[tuple[str, int]], stamp: int = 0,
           pad: int = 0) -> None:
    messages = [Message(t, f"m{seq}-{i}".encode() + b"." * pad, queue_id=q, tags=f"tag{i % 2}",
                        store_timestamp_ms=stamp)
                for i, (t, q) in enumerate(keys)]
    log.append(log.build_entries(1, [(KIND_MESSAGES, encode_messages(messages, 4096))]))


def _queues(store: ConsumeQueueStore) -> dict[tuple[str, int], tuple[int, int, bytes]]:
    """Everything observable of every non-empty queue."""
    return {key: (q.min_offset, q.max_offset, q.all_units().tobytes())
            for key, q in sorted(store.queues.items()) if q.max_offset > q.min_offset}


def test_only_committed_entries_are_dispatched_in_log_order(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(10):
            _batch(log, seq, KEYS)
        log.append(log.build_entries(1, [(KIND_CONTROL, b"\x80")]))  # not a message entry
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert store.dispatch_committed(6) == 6
        assert store.offsets("A", 0) == (0, 6)
        assert store.offsets("Z", 0) == (0, 0)
        units = store.read("B", 2, 0, 100)
        assert [u.queue_offset for u in units] == list(range(6))
        for unit in units:
            stored = log.read_message(unit.physical_offset, unit.size)
            assert (stored.message.topic, stored.message.queue_id) == ("B", 2)
            assert unit.tag_hash == tag_hash(stored.message.tags)
        # Units follow the log: physical offsets strictly increase with the slot.
        assert all(a.physical_offset < b.physical_offset for a, b in itertools.pairwise(units))
        store.dispatch_committed(11)
        assert store.offsets("A", 1) == (0, 10)
        store.close()


def test_offset_for_timestamp(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(20):
            _batch(log, seq, [("A", 0)], stamp=1000 + 10 * seq)
        store = ConsumeQueueStore.open(d, log)
        store.dispatch_committed(log.last_index)
        assert store.offset_for_timestamp("A", 0, 0) == 0
        assert store.offset_for_timestamp("A", 0, 1050) == 5
        assert store.offset_for_timestamp("A", 0, 1051) == 6
        assert store.offset_for_timestamp("A", 0, 99_999) == 20
        store.close()


def _twelve_entries_five_dispatched(d: str, log: CommitLog) -> ConsumeQueueStore:
    """A log of 12 entries over KEYS and a store (4 units per file) that has
    dispatched the first 5."""
    for seq in range(12):
        _batch(log, seq, KEYS)
    store = ConsumeQueueStore.open(d, log, units_per_file=4)
    store.dispatch_committed(5)
    return store


def test_units_beyond_the_checkpoint_are_dropped_and_redispatched(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        store = _twelve_entries_five_dispatched(d, log)
        store.checkpoint()
        store.dispatch_committed(12)
        expected = _queues(store)
        store.abandon()  # crash: the last 7 entries' units are not checkpointed
        # Tear a queue file's tail too.
        path = os.path.join(d, "consumequeue", "A", "0")
        last = sorted(os.listdir(path))[-1]
        os.truncate(os.path.join(path, last), os.path.getsize(os.path.join(path, last)) - 3)
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert store.dispatched_index == 5
        assert store.recovery.units_dropped > 0
        assert store.offsets("A", 0) == (0, 5)
        store.dispatch_committed(12)
        assert _queues(store) == expected
        store.close()


def test_a_checkpoint_run_on_another_thread_claims_what_was_dispatched_at_its_start(
        tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        store = _twelve_entries_five_dispatched(d, log)
        token = store.begin_checkpoint()
        store.dispatch_committed(9)  # dispatch goes on while the checkpoint runs
        worker = threading.Thread(target=store.run_checkpoint, args=(token,))
        worker.start()
        worker.join()
        store.dispatch_committed(12)
        expected = _queues(store)
        store.abandon()  # crash: only the checkpoint's claim is trusted
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert store.dispatched_index == 5
        assert store.offsets("A", 0) == (0, 5)
        store.dispatch_committed(12)
        assert _queues(store) == expected
        store.close()


def test_a_queue_whose_files_are_missing_is_rebuilt(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(12):
            _batch(log, seq, KEYS)
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        store.dispatch_committed(12)
        expected = _queues(store)
        store.close()
        shutil.rmtree(os.path.join(d, "consumequeue", "B", "2"))
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert store.recovery.queues_rebuilt == [("B", 2)]
        assert _queues(store) == expected
        store.close()


def test_foreign_files_in_the_queue_tree_are_reported_not_deleted(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        _batch(log, 0, KEYS)
        store = ConsumeQueueStore.open(d, log)
        store.dispatch_committed(1)
        store.close()
        stray = os.path.join(d, "consumequeue", "A", "0", "README")
        with open(stray, "w") as handle:
            handle.write("x")
        # A queue "²" (str.isdigit() takes it, int() refuses it) or "٣"
        # (int() reads 3), a topic "A\n": directories, not queues.
        odd = [os.path.join(d, "consumequeue", "A", "\u00b2"),
               os.path.join(d, "consumequeue", "A", "\u0663"),
               os.path.join(d, "consumequeue", "A\n")]
        for path in odd:
            os.makedirs(path)
        store = ConsumeQueueStore.open(d, log)
        assert stray in store.recovery.foreign_files
        assert set(odd[:2]) <= set(store.recovery.foreign_files)
        assert ("A\n", 3) not in _queues(store) and ("A", 3) not in _queues(store)
        assert os.path.exists(stray)
        store.close()


def test_retention_removes_whole_queue_files_and_raises_min_offset(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(40):
            _batch(log, seq, [("A", 0)], pad=300)
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        store.dispatch_committed(40)
        log.flush()
        log.delete_before(log.segments.bases[2])
        first = log.read_entry(log.first_index)
        boundary = decode_messages(first.body, first.position)[0].physical_offset
        removed = store.delete_before(boundary)
        low, high = store.offsets("A", 0)
        # Whole files went, and min_offset is the first message the log still
        # holds (one message per entry here), not the first file's start.
        assert removed > 0 and high == 40
        assert low == log.first_index - 1
        (unit,) = store.read("A", 0, 0, 1)
        assert unit.queue_offset == low and unit.physical_offset == boundary
        assert log.read_message(unit.physical_offset, unit.size).message.queue_id == 0
        store.close()
        # An open derives the same min_offset from the log's first position.
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert store.offsets("A", 0) == (low, 40)
        assert store.read("A", 0, 0, 1)[0].queue_offset == low
        store.close()


def _file_sizes(data_dir: str) -> dict[str, int]:
    sizes = {}
    for root, _dirs, files in os.walk(os.path.join(data_dir, "consumequeue")):
        for name in files:
            if name.isdigit():
                sizes[os.path.join(root, name)] = os.path.getsize(os.path.join(root, name))
    return sizes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rebuilt_queues_equal_incremental_ones_after_random_crashes(data: st.DataObject) -> None:
    d = tempfile.mkdtemp(prefix="cq-")
    try:
        log = CommitLog.open(d, SMALL)
        store = ConsumeQueueStore.open(d, log, units_per_file=5)
        commit = 0
        synced: dict[str, int] = {}
        for _round in range(data.draw(st.integers(1, 6))):
            for seq in range(data.draw(st.integers(0, 6))):
                keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=5))
                _batch(log, seq, keys)
            commit = data.draw(st.integers(commit, log.last_index))
            store.dispatch_committed(commit)
            if data.draw(st.booleans()):
                store.checkpoint()
                synced = _file_sizes(d)
            if data.draw(st.booleans()):
                # Crash: lose or tear queue bytes written since the checkpoint
                # (what it covers was fsynced first), then recover.
                store.abandon()
                for path, size in _file_sizes(d).items():
                    keep = min(synced.get(path, 0), size)
                    os.truncate(path, data.draw(st.integers(keep, size)))
                store = ConsumeQueueStore.open(d, log, units_per_file=5)
                store.dispatch_committed(commit)
        incremental = _queues(store)
        store.close()
        log.close()
        # From scratch, on a fresh process's view of the same log.
        ConsumeQueueStore.destroy(d)
        log = CommitLog.open(d, SMALL)
        rebuilt = ConsumeQueueStore.open(d, log, units_per_file=5)
        rebuilt.dispatch_committed(commit)
        assert _queues(rebuilt) == incremental
        for key, (_low, high, _raw) in incremental.items():
            assert high == len(rebuilt.read(*key, 0, 10_000))
            assert np.all(np.diff(rebuilt.get(*key).all_units()["offset"].astype(np.int64)) > 0)
        rebuilt.close()
        log.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_one_queue_replaced_from_a_trimmed_log_keeps_its_numbering_and_its_tail(tmp_path
                                                                                 ) -> None:
    """What a runtime repair does (ledgermq/broker/queue_repair.py): the
    queue's units scanned from what the log still holds, numbered back from
    the queue's end at the scan, and the slots dispatched after the scan
    kept. The result equals the queue as dispatch made it."""
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(40):
            _batch(log, seq, [("A", 0), ("B", 0)], pad=300)
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        store.dispatch_committed(30)
        log.flush()
        log.delete_before(log.segments.bases[2])
        first = log.read_entry(log.first_index)
        store.delete_before(decode_messages(first.body, first.position)[0].physical_offset)
        # The scan, in small steps, up to what was dispatched when it began.
        upto_index, upto = store.dispatched_index, store.offsets("A", 0)[1]
        found, count, index = b"", 0, log.first_index
        while index <= upto_index:
            raw, n, index = store.units_in_log(("A", 0), index, upto_index, batch_bytes=2048)
            found, count = found + raw, count + n
        store.dispatch_committed(40)  # dispatch goes on meanwhile
        expected = _queues(store)
        generation = store.generation
        store.replace_queue(("A", 0), upto - count, found, count, upto)
        assert store.generation != generation  # a checkpoint under way drops itself
        assert _queues(store) == expected
        try:
            store.replace_queue(("A", 0), 0, found, count, upto)  # numbered wrong
        except ValueError as error:
            assert "replacing queue" in str(error)
        else:
            raise AssertionError("a replacement that does not end at `upto` was taken")
        store.close()
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        assert _queues(store) == expected
        store.close()
