"""Topic deletion and rebuilding: drop_topic, skip_before, rebuild after an
install, and a crash in the middle of each."""

from __future__ import annotations

import os

import pytest
from storage_crash import crash_points
from storage_support import SMALL

from commitlog import KIND_MESSAGES, CommitLog, Message, encode_messages, fileio
from consumequeue import ConsumeQueueStore

QueueKey = tuple[str, int]


def _batch(log: CommitLog, seq: int, keys: list[QueueKey], pad: int = 0) -> int:
    """One MESSAGES entry with a message per key; its index."""
    messages = [Message(t, f"m{seq}-{i}".encode() + b"." * pad, queue_id=q, tags="x")
                for i, (t, q) in enumerate(keys)]
    log.append(log.build_entries(1, [(KIND_MESSAGES, encode_messages(messages, 4096))]))
    return log.last_index


def _queues(store: ConsumeQueueStore) -> dict[QueueKey, tuple[int, int, bytes]]:
    return {key: (q.min_offset, q.max_offset, q.all_units().tobytes())
            for key, q in sorted(store.queues.items()) if q.max_offset > q.min_offset}


def _bodies(store: ConsumeQueueStore, key: QueueKey) -> list[bytes]:
    low, high = store.offsets(*key)
    return [store.log.read_message(u.physical_offset, u.size).message.body
            for u in store.read(*key, low, high - low)]


def _topic_files(d: str, topic: str) -> list[str]:
    root = os.path.join(d, "consumequeue", topic)
    return [os.path.join(r, n) for r, _ds, ns in os.walk(root) for n in ns]


def test_skip_before_keeps_a_deleted_topics_old_messages_out(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(5):
            _batch(log, seq, [("A", 0), ("B", 0)])
        deleted_at = log.last_index + 1  # the entry that deletes A (not a message here)
        _batch(log, 5, [("B", 0)])
        for seq in range(6, 9):
            _batch(log, seq, [("A", 0), ("B", 0)])
        store = ConsumeQueueStore.open(d, log)
        store.dispatch_committed(log.last_index, skip_before={"A": deleted_at})
        assert store.offsets("A", 0) == (0, 3)  # re-created: starts at 0
        assert _bodies(store, ("A", 0)) == [b"m6-0", b"m7-0", b"m8-0"]
        assert store.offsets("B", 0) == (0, 9)
        store.close()


def test_the_stores_skip_before_is_the_default_and_a_call_may_override_it(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(4):
            _batch(log, seq, [("A", 0)])
        store = ConsumeQueueStore.open(d, log, skip_before={"A": 3})
        store.dispatch(log.read_entries(1, 3))
        assert store.offsets("A", 0) == (0, 0)
        store.dispatch(log.read_entries(3, 5), skip_before={})
        assert store.offsets("A", 0) == (0, 2)
        store.close()


def test_drop_topic_deletes_its_files_and_a_recreated_topic_starts_empty(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(12):
            _batch(log, seq, [("A", 0), ("A", 1), ("B", 0)])
        store = ConsumeQueueStore.open(d, log, units_per_file=4)
        store.dispatch_committed(log.last_index)
        b_before = _queues(store)[("B", 0)]
        files = _topic_files(d, "A")
        size = sum(os.path.getsize(p) for p in files)
        assert size == 2 * 12 * 20
        deleted_at = log.last_index + 1
        assert store.drop_topic("A", skip_before=deleted_at) == size
        assert not os.path.exists(os.path.join(d, "consumequeue", "A"))
        assert store.offsets("A", 0) == (0, 0) and store.get("A", 1) is None
        assert store.drop_topic("A") == 0  # nothing left to drop
        _batch(log, 99, [("A", 0)])  # the name is used again
        store.dispatch_committed(log.last_index)
        assert _bodies(store, ("A", 0)) == [b"m99-0"]
        assert _queues(store)[("B", 0)] == b_before
        store.close()
        # Reopened (the deletion known): nothing old comes back.
        store = ConsumeQueueStore.open(d, log, units_per_file=4,
                                       skip_before={"A": deleted_at})
        assert _bodies(store, ("A", 0)) == [b"m99-0"] and store.get("A", 1) is None
        store.close()
        # Even a full rebuild from the log keeps the deleted messages out.
        ConsumeQueueStore.destroy(d)
        store = ConsumeQueueStore.open(d, log, units_per_file=4,
                                       skip_before={"A": deleted_at})
        store.dispatch_committed(log.last_index)
        assert _bodies(store, ("A", 0)) == [b"m99-0"] and store.get("A", 1) is None
        store.close()


def test_foreign_files_keep_their_directory_when_a_topic_is_dropped(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        _batch(log, 0, [("A", 0), ("A", 1)])
        store = ConsumeQueueStore.open(d, log)
        store.dispatch_committed(1)
        stray = os.path.join(d, "consumequeue", "A", "1", "notes")
        with open(stray, "w") as handle:
            handle.write("mine")
        store.drop_topic("A")
        assert os.path.exists(stray)
        assert not os.path.exists(os.path.join(d, "consumequeue", "A", "0"))
        store.close()


def test_a_checkpoint_taken_before_a_drop_cannot_bring_the_topic_back(tmp_path) -> None:
    d = str(tmp_path)
    with CommitLog.open(d, SMALL) as log:
        for seq in range(6):
            _batch(log, seq, [("A", 0), ("B", 0)])
        store = ConsumeQueueStore.open(d, log)
        store.dispatch_committed(6)
        token = store.begin_checkpoint()  # the loop's, to be written on a thread
        store.drop_topic("A")
        assert not store.run_checkpoint(token)  # its late write would claim A again
        store.abandon()
        store = ConsumeQueueStore.open(d, log)  # no skip_before: the files alone
        assert store.get("A", 0) is None and store.offsets("B", 0) == (0, 6)
        store.close()


def test_a_crash_at_any_point_of_drop_topic_leaves_the_topic_whole_or_gone() -> None:
    node = "/node"
    boxes: dict[str, object] = {}

    def setup(_fs: object) -> None:
        log = CommitLog.open(node, SMALL)
        for seq in range(10):
            _batch(log, seq, [("A", 0), ("A", 1), ("B", 0)], pad=40)
        store = ConsumeQueueStore.open(node, log, units_per_file=4)
        store.dispatch_committed(log.last_index)
        store.checkpoint()
        boxes["before"] = _queues(store)
        boxes["store"] = store

    def action(_fs: object) -> None:
        store = boxes["store"]
        assert isinstance(store, ConsumeQueueStore)
        store.drop_topic("A")

    def check(_fs: object, completed: bool) -> None:
        before = boxes["before"]
        assert isinstance(before, dict)
        with CommitLog.open(node, SMALL) as log:
            store = ConsumeQueueStore.open(node, log, units_per_file=4)
            store.dispatch_committed(log.last_index)
            after = _queues(store)
            assert after[("B", 0)] == before[("B", 0)]
            a_keys = {k: v for k, v in after.items() if k[0] == "A"}
            whole = {k: v for k, v in before.items() if k[0] == "A"}
            assert a_keys in ({}, whole), "A neither whole nor gone"
            if completed:
                assert a_keys == {}
            if not a_keys:  # gone, files and directories too
                assert store.get("A", 0) is None and store.get("A", 1) is None
                assert not fileio.fs.isdir(os.path.join(node, "consumequeue", "A"))
            store.close()

    assert crash_points(node, setup, action, check) > 3


def _log_and_expected(d: str) -> tuple[CommitLog, dict[QueueKey, int], dict]:
    """A log of 40 entries over three queues, the first segments deleted by
    retention; the next offsets at its end and the incrementally built queues
    (retention applied) to compare a rebuild with."""
    log = CommitLog.open(d, SMALL)
    keys = [("A", 0), ("B", 0), ("B", 1)]
    for seq in range(40):
        _batch(log, seq, keys[: 1 + seq % 3], pad=150)
    store = ConsumeQueueStore.open(d, log, units_per_file=8)
    store.dispatch_committed(40)
    store.checkpoint()
    log.flush()
    assert log.delete_before(log.segments.bases[3]) == 3
    store.delete_before(log.segments.bases[0])
    expected_next = {key: q.max_offset for key, q in store.queues.items()}
    incremental = _queues(store)
    store.close()
    return log, expected_next, incremental


def test_rebuild_from_a_log_with_a_moved_first_index(tmp_path) -> None:
    d = str(tmp_path)
    log, expected_next, incremental = _log_and_expected(d)
    assert log.first_index > 1
    ConsumeQueueStore.destroy(d)  # as after an install: nothing of the old queues
    store = ConsumeQueueStore.open(d, log, units_per_file=8)
    assert store.recovery.needs_rebuild
    store.rebuild(log.first_index, 40, expected_next)
    assert not store.recovery.needs_rebuild
    assert store.dispatched_index == 40
    assert _queues(store) == incremental
    assert all(store.offsets(*k)[0] > 0 for k in expected_next)
    store.close()
    store = ConsumeQueueStore.open(d, log, units_per_file=8)
    assert _queues(store) == incremental and not store.recovery.needs_rebuild
    store.close()
    log.close()


def test_rebuild_replaces_whatever_queues_were_there_and_honours_skip_before(tmp_path) -> None:
    d = str(tmp_path)
    log, expected_next, _incremental = _log_and_expected(d)
    store = ConsumeQueueStore.open(d, log, units_per_file=8)
    deleted_at = 30
    skipped = sum(1 for e in log.read_entries(log.first_index, deleted_at)
                  if e.kind == KIND_MESSAGES)  # A has a message in every entry
    expected_next[("A", 0)] = 40 - deleted_at + 1  # only A's messages since the deletion
    store.rebuild(log.first_index, 40, expected_next, skip_before={"A": deleted_at})
    assert skipped > 0
    assert store.offsets("A", 0) == (0, 11)
    assert _bodies(store, ("A", 0)) == [b"m%d-0" % s + b"." * 150 for s in range(29, 40)]
    store.close()
    log.close()


def test_rebuild_refuses_a_state_that_does_not_match_the_log(tmp_path) -> None:
    d = str(tmp_path)
    log, expected_next, _incremental = _log_and_expected(d)
    store = ConsumeQueueStore.open(d, log, units_per_file=8)
    before = _queues(store)
    with pytest.raises(ValueError, match="more messages than expected_next"):
        store.rebuild(log.first_index, 40, {("A", 0): 1})
    with pytest.raises(ValueError, match="log holds"):
        store.rebuild(1, 40, expected_next)
    with pytest.raises(ValueError, match="log holds"):
        store.rebuild(log.first_index, 41, expected_next)
    assert _queues(store) == before  # refused before anything changed
    store.close()
    log.close()


def test_a_crash_at_any_point_of_a_rebuild_recovers_to_the_rebuilt_queues() -> None:
    node = "/node"
    boxes: dict[str, object] = {}

    def setup(_fs: object) -> None:
        log, expected_next, incremental = _log_and_expected(node)
        boxes.update(log=log, expected_next=expected_next, incremental=incremental)
        boxes["store"] = ConsumeQueueStore.open(node, log, units_per_file=8)

    def action(_fs: object) -> None:
        store, log = boxes["store"], boxes["log"]
        assert isinstance(store, ConsumeQueueStore) and isinstance(log, CommitLog)
        store.rebuild(log.first_index, 40, boxes["expected_next"])  # type: ignore[arg-type]

    def check(_fs: object, _completed: bool) -> None:
        with CommitLog.open(node, SMALL) as log:
            store = ConsumeQueueStore.open(node, log, units_per_file=8)
            assert not store.recovery.needs_rebuild
            store.dispatch_committed(40)
            assert _queues(store) == boxes["incremental"]
            store.close()

    assert crash_points(node, setup, action, check, seeds=2) > 3
