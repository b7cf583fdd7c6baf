"""Unit tests of the replication core's parts: placement, storage, log, progress, quorum, node."""

from __future__ import annotations

import random

import pytest

from dledger import (
    ENTRY_HEADER_BYTES,
    Config,
    Entry,
    EntryKind,
    HardState,
    InvariantViolation,
    MemoryLogStorage,
    NotLeader,
    RaftNode,
    place_in_segments,
    segment_placement,
)
from dledger.log import RaftLog
from dledger.progress import Progress, ProgressState
from dledger.quorum import quorum_index
from dledger.storage import SnapshotMeta


def test_placement_rule_rolls_over_segments() -> None:
    assert place_in_segments(0, 48, 100) == 0
    assert place_in_segments(52, 48, 100) == 52  # fits exactly: 52 + 48 == 100
    assert place_in_segments(53, 48, 100) == 100  # does not fit: next segment
    assert place_in_segments(250, 60, 100) == 300
    with pytest.raises(ValueError):
        place_in_segments(0, 101, 100)


def entries_from(start: int, terms: list[int], place=segment_placement(128)) -> list[Entry]:  # noqa: B008
    out, end = [], 0
    for offset, term in enumerate(terms):
        data = b"d" * (10 * (offset % 4))
        position = place(end, 48 + len(data))
        out.append(Entry(start + offset, term, EntryKind.MESSAGES, data, position))
        end = position + 48 + len(data)
    return out


def test_memory_storage_reads_with_byte_limit() -> None:
    storage = MemoryLogStorage(entries=entries_from(1, [1, 1, 2, 2]))
    assert (storage.first_index(), storage.last_index(), storage.term(3)) == (1, 4, 2)
    assert len(storage.entries(1, 5, 1)) == 1  # at least one entry even over the limit
    assert len(storage.entries(1, 5, 10_000)) == 4
    storage.truncate_after(2)
    assert storage.last_index() == 2


def test_log_append_replaces_conflicting_suffix_and_checks_positions() -> None:
    place = segment_placement(128)
    log = RaftLog(MemoryLogStorage(), place)
    log.append(entries_from(1, [1, 1, 1], place), commit=0)
    replacement = entries_from(1, [1, 2], place)[1:]
    log.append(replacement, commit=1)
    assert [log.term(i) for i in (1, 2)] == [1, 2] and log.last_index == 2
    with pytest.raises(InvariantViolation):
        log.append(entries_from(1, [3], place), commit=1)  # would cut a committed entry
    bad = Entry(3, 2, EntryKind.MESSAGES, b"", 999)
    with pytest.raises(InvariantViolation):
        log.append([bad], commit=1)  # position breaks the placement rule


def test_log_reads_across_stable_and_unstable() -> None:
    place = segment_placement(1024)
    stored = entries_from(1, [1, 1, 1], place)
    log = RaftLog(MemoryLogStorage(entries=stored), place)
    tail = entries_from(1, [1, 1, 1, 2, 2], place)[3:]
    log.append(tail, commit=0)
    got = log.entries(2, 6, 1 << 20, 100)
    assert [e.index for e in got] == [2, 3, 4, 5]
    assert [e.index for e in log.entries(2, 6, 1 << 20, 2)] == [2, 3]


def test_log_last_index_follows_every_change_of_offset_and_tail() -> None:
    # RaftLog.last_index is a field (read a few dozen times per message), so
    # every change of the log's offset or unstable tail must keep it at
    # offset - 1 + len(unstable): appends that extend, replace an unstable
    # suffix or cut into persisted entries, persisting (stable_to) and a
    # restored snapshot.
    rng = random.Random(18)
    place = segment_placement(256)
    storage = MemoryLogStorage()
    log = RaftLog(storage, place)
    commit, term = 0, 1
    for step in range(3000):
        op = rng.random()
        if op < 0.45:
            first = rng.randint(commit + 1, log.last_index + 1)
            term += rng.random() < 0.2
            before = first - 1
            if log.snapshot is not None and before == log.snapshot.index:
                end = log.snapshot.end_position
            else:
                end = log.entry(before).end_position if before else 0
            entries = []
            for index in range(first, first + rng.randint(1, 4)):
                data = b"d" * rng.randint(0, 40)
                position = place(end, ENTRY_HEADER_BYTES + len(data))
                entries.append(Entry(index, term, EntryKind.MESSAGES, data, position))
                end = position + ENTRY_HEADER_BYTES + len(data)
            log.append(entries, commit)
        elif op < 0.8:
            handed = log.take_unpersisted()
            if handed:
                storage.truncate_after(handed[0].index - 1)
                storage.append(list(handed))
                log.stable_to(handed[-1].index, handed[-1].term)
        elif op < 0.97:
            commit = rng.randint(commit, min(log.last_index, log.offset - 1))
        elif log.last_index > commit:
            last = log.entry(log.last_index)
            meta = SnapshotMeta(last.index + 5, last.term, last.end_position + 4096)
            log.restore(meta)
            storage.install(meta)
            assert log.snapshot_persisted(meta)
            commit = meta.index
        assert log.last_index == log.offset - 1 + len(log.unstable), step
        assert log.term_or_none(log.last_index + 1) is None
        assert log.last_index == 0 or log.term_or_none(log.last_index) is not None


def test_progress_window_and_stale_answers() -> None:
    pr = Progress(next_index=5, inflight_max=2)
    pr.match = 4
    pr.become_replicate()
    pr.sent(6)
    pr.sent(8)
    assert pr.paused() and pr.next == 9
    assert pr.update(6) and not pr.paused()
    assert not pr.update(5)  # stale
    assert not pr.decrease(rejected=5, match_hint=3)  # older than match
    assert pr.decrease(rejected=8, match_hint=7)
    assert pr.state is ProgressState.PROBE and pr.next == 8


def test_quorum_index() -> None:
    assert quorum_index([5, 3, 1]) == 3
    assert quorum_index([9, 9, 1, 1, 2]) == 2
    assert quorum_index([4]) == 4


def test_single_node_elects_itself_and_commits() -> None:
    storage = MemoryLogStorage()
    node = RaftNode(Config(1, frozenset({1})), storage, random.Random(1))
    with pytest.raises(NotLeader):
        node.propose(EntryKind.MESSAGES, b"early")
    node.campaign()
    index, term = node.propose(EntryKind.MESSAGES, b"hello")
    assert (index, term) == (2, 1)
    applied = []
    while node.has_ready():
        ready = node.ready()
        storage.append(ready.entries)
        if ready.hard_state:
            storage.set_hard_state(ready.hard_state)
        applied += ready.committed_entries
        node.advance(ready)
    assert [e.data for e in applied] == [b"", b"hello"]
    assert storage.hard_state == HardState(1, 1, 2)
    status = node.status()
    assert (status.commit_index, status.last_index, status.applied_index) == (2, 2, 2)


def test_ready_before_advance_is_refused() -> None:
    node = RaftNode(Config(1, frozenset({1, 2, 3})), MemoryLogStorage(), random.Random(1))
    node.campaign()
    node.ready()
    with pytest.raises(InvariantViolation):
        node.ready()
