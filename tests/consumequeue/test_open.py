"""Opening ConsumeQueues: what the dispatch checkpoint vouches for is checked
by length only, so an open reads the tail written after it, not the whole
queue; and every damage the full scan finds is still found."""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from collections import Counter

import msgpack
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_crash import crash_points
from storage_support import SMALL

from commitlog import KIND_MESSAGES, CommitLog, Message, encode_messages, fileio
from consumequeue import UNIT_SIZE, ConsumeQueue, ConsumeQueueStore, DispatchCheckpoint
from consumequeue.checkpoint import read_dispatch_checkpoint, write_dispatch_checkpoint
from consumequeue.unit import encode_units
from dledger.testing.nodesim.simfs import NO_FAULTS, DiskFaults, SimFileSystem

QueueKey = tuple[str, int]
KEYS = [("A", 0), ("B", 1)]
NODE = "/node"


class CountingFS(SimFileSystem):
    """The in-memory file system, counting the bytes read from each path."""

    def __init__(self) -> None:
        super().__init__(random.Random(0))
        self.read_bytes: Counter[str] = Counter()

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = super().pread(fd, length, offset)
        self.read_bytes[self._fd(fd).path] += len(data)
        return data

    def queue_reads(self) -> int:
        """Bytes read from queue files (not the checkpoint, not the log)."""
        return sum(n for path, n in self.read_bytes.items()
                   if "/consumequeue/" in path and not path.endswith("checkpoint"))


def _batch(log: CommitLog, seq: int, per_key: int = 4) -> None:
    messages = [Message(t, b"m%d" % seq, queue_id=q, tags="x")
                for t, q in KEYS for _ in range(per_key)]
    log.append(log.build_entries(1, [(KIND_MESSAGES, encode_messages(messages, 4096))]))


def _queues(store: ConsumeQueueStore) -> dict[QueueKey, tuple[int, int, bytes]]:
    return {key: (q.min_offset, q.max_offset, q.all_units().tobytes())
            for key, q in sorted(store.queues.items()) if q.max_offset > q.min_offset}


def _checkpointed_then_tail(d: str, entries: int, tail: int, units_per_file: int = 64
                            ) -> dict[QueueKey, tuple[int, int, bytes]]:
    """`entries` entries dispatched and checkpointed, `tail` more dispatched
    after the checkpoint, then a crash (no checkpoint, files as written).
    Returns the queues as they were."""
    log = CommitLog.open(d, SMALL)
    for seq in range(entries + tail):
        _batch(log, seq)
    store = ConsumeQueueStore.open(d, log, units_per_file=units_per_file)
    store.dispatch_committed(entries)
    store.checkpoint()
    store.dispatch_committed(entries + tail)
    expected = _queues(store)
    store.abandon()
    log.close()
    return expected


def _reopen_reads(entries: int, tail: int, unvouched: bool = False) -> tuple[int, int]:
    """(bytes read from queue files by a reopen, bytes of queue files)."""
    fs = CountingFS()
    with fileio.use(fs):
        expected = _checkpointed_then_tail(NODE, entries, tail)
        if unvouched:  # a checkpoint as an older version wrote it: no files_synced
            cq = os.path.join(NODE, "consumequeue")
            checkpoint = read_dispatch_checkpoint(cq)
            assert checkpoint is not None and checkpoint.files_synced
            checkpoint.files_synced = False
            write_dispatch_checkpoint(cq, checkpoint)
        fs.read_bytes.clear()
        with CommitLog.open(NODE, SMALL) as log:
            store = ConsumeQueueStore.open(NODE, log, units_per_file=64)
            reads = fs.queue_reads()
            assert store.dispatched_index == entries
            store.dispatch_committed(entries + tail)
            assert _queues(store) == expected
            size = store.disk_bytes()
            store.close()
    return reads, size


def test_an_open_reads_the_tail_after_the_checkpoint_not_the_whole_queue() -> None:
    tail_units = 3 * 4  # per queue: three entries of 4 messages each
    reads_short, size_short = _reopen_reads(entries=40, tail=3)
    reads_long, size_long = _reopen_reads(entries=400, tail=3)
    assert size_long > 9 * size_short
    # The same bytes for a queue ten times as long: per queue the tail,
    # and a few single units (the first filled slot, the cut at the
    # checkpoint galloping back from the end, the retention floor).
    assert reads_long == reads_short
    assert reads_long <= len(KEYS) * UNIT_SIZE * (tail_units + 3 * 4)
    # Without the checkpoint's word for the files (an older version wrote
    # it), the same open reads them all.
    reads_unvouched, _ = _reopen_reads(entries=400, tail=3, unvouched=True)
    assert reads_unvouched >= size_long - len(KEYS) * UNIT_SIZE * tail_units


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 9), st.lists(st.integers(1, 5), max_size=40), st.data())
def test_first_offset_at_or_after_is_the_first_unit_at_or_past_a_position(
        first: int, gaps: list[int], data: st.DataObject) -> None:
    offsets = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    position = data.draw(st.integers(0, (offsets[-1] if offsets else 0) + 2), label="position")
    root = tempfile.mkdtemp(prefix="cq-search-")
    try:
        queue = ConsumeQueue(root, "A", 0, 4)
        queue.start_at(first)
        queue.append([(offset, 1, 0) for offset in offsets])
        expected = next((first + i for i, o in enumerate(offsets) if o >= position),
                        first + len(offsets))
        assert queue.first_offset_at_or_after(position) == expected
        queue.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _first_checkpoint_syncs(unvouched: bool) -> tuple[set[str], set[str]]:
    """(the queue files the first checkpoint after a reopen syncs, all queue
    files); after that checkpoint, it vouches for the files."""
    fs = CountingFS()
    with fileio.use(fs):
        _checkpointed_then_tail(NODE, 40, 3)
        cq = os.path.join(NODE, "consumequeue")
        if unvouched:
            checkpoint = read_dispatch_checkpoint(cq)
            assert checkpoint is not None
            checkpoint.files_synced = False
            write_dispatch_checkpoint(cq, checkpoint)
        with CommitLog.open(NODE, SMALL) as log:
            store = ConsumeQueueStore.open(NODE, log, units_per_file=64)
            token = store.begin_checkpoint()
            synced = {path for _fd, path, _length in token.fds}
            every = {q.files.path(b) for q in store.queues.values() for b in q.files.bases}
            store.run_checkpoint(token)
            checkpoint = read_dispatch_checkpoint(cq)
            assert checkpoint is not None and checkpoint.files_synced
            store.close()
    return synced, every


def test_the_first_checkpoint_after_an_open_syncs_every_file_the_open_did_not_trust() -> None:
    # Read by a full scan: maybe only in the page cache (a process that
    # crashed before syncing wrote them), so all are synced before a claim.
    synced, every = _first_checkpoint_syncs(unvouched=True)
    assert synced == every
    # Vouched for: only the tail the open read (the file holding the
    # checkpoint's next offset, per queue) is synced again.
    synced, every = _first_checkpoint_syncs(unvouched=False)
    assert synced < every and len(synced) == len(KEYS)


def _store_with_files(d: str, entries: int = 12) -> tuple[CommitLog, dict, str]:
    """A checkpointed store (4 units per file, so queue A/0 has 12 files)."""
    log = CommitLog.open(d, SMALL)
    for seq in range(entries):
        _batch(log, seq)
    store = ConsumeQueueStore.open(d, log, units_per_file=4)
    store.dispatch_committed(entries)
    expected = _queues(store)
    store.close()
    return log, expected, os.path.join(d, "consumequeue", "A", "0")


def test_a_short_file_below_the_checkpoint_is_a_torn_file_and_the_queue_is_rebuilt(
        tmp_path) -> None:
    d = str(tmp_path)
    log, expected, queue_dir = _store_with_files(d)
    # A power cut tore an earlier file while later ones survived.
    os.truncate(os.path.join(queue_dir, f"{20:020d}"), 2 * UNIT_SIZE + 7)
    store = ConsumeQueueStore.open(d, log, units_per_file=4)
    assert store.recovery.queues_rebuilt == [("A", 0)]
    assert _queues(store) == expected
    # The rebuild rewrote slots the checkpoint vouched for: until the next
    # checkpoint has synced them, it no longer does.
    checkpoint = read_dispatch_checkpoint(os.path.join(d, "consumequeue"))
    assert checkpoint is not None and not checkpoint.files_synced
    store.close()
    checkpoint = read_dispatch_checkpoint(os.path.join(d, "consumequeue"))
    assert checkpoint is not None and checkpoint.files_synced
    store = ConsumeQueueStore.open(d, log, units_per_file=4)
    assert store.recovery.queues_rebuilt == [] and _queues(store) == expected
    store.close()
    log.close()


def test_a_missing_file_below_the_checkpoint_is_a_hole_and_the_queue_is_rebuilt(
        tmp_path) -> None:
    d = str(tmp_path)
    log, expected, queue_dir = _store_with_files(d)
    os.remove(os.path.join(queue_dir, f"{16:020d}"))
    store = ConsumeQueueStore.open(d, log, units_per_file=4)
    assert store.recovery.queues_rebuilt == [("A", 0)]
    assert _queues(store) == expected
    store.close()
    log.close()


def _unit_files(d: str, units_per_file: int, first: int, count: int) -> None:
    """Queue files holding `count` units from slot `first` (the slots before
    it empty, files wholly before it absent), each unit pointing 100 bytes on."""
    os.makedirs(d, exist_ok=True)
    slot = first
    while slot < first + count:
        base = slot - slot % units_per_file
        take = min(first + count, base + units_per_file) - slot
        raw = encode_units([(1000 + 100 * s, 50, 7) for s in range(slot, slot + take)])
        with open(os.path.join(d, f"{base:020d}"), "r+b" if os.path.exists(
                os.path.join(d, f"{base:020d}")) else "wb") as handle:
            handle.seek((slot - base) * UNIT_SIZE)
            handle.write(raw)
        slot += take


def _bounds(d: str, units_per_file: int, trusted_next: int | None
            ) -> tuple[int, int, bytes, dict[str, int]]:
    queue = ConsumeQueue(d, "A", 0, units_per_file, trusted_next)
    try:
        files = {name: os.path.getsize(os.path.join(d, name)) for name in sorted(os.listdir(d))}
        return queue.min_offset, queue.max_offset, queue.all_units().tobytes(), files
    finally:
        queue.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_vouched_for_open_finds_what_the_full_scan_finds(data: st.DataObject) -> None:
    """Files below the checkpoint's next offset as it saw them (leading files
    maybe gone to retention, or a prefix damaged in a way their lengths
    show); any damage after it. Opening with the checkpoint's word and with
    a full scan leave the same queue and the same files."""
    per = data.draw(st.integers(2, 5), label="units per file")
    first = data.draw(st.integers(0, 12), label="first filled slot")
    count = data.draw(st.integers(0, 30), label="units")
    claimed = data.draw(st.integers(first, first + count), label="checkpoint's next")
    root = tempfile.mkdtemp(prefix="cq-open-")
    try:
        base_dir = os.path.join(root, "q")
        _unit_files(base_dir, per, first, count)
        if data.draw(st.booleans(), label="retention removed leading files"):
            names = sorted(os.listdir(base_dir))
            for name in names[: data.draw(st.integers(0, max(0, len(names) - 1)))]:
                os.remove(os.path.join(base_dir, name))
        names = sorted(os.listdir(base_dir))
        tail = [n for n in names if int(n) + per > claimed]
        for _ in range(data.draw(st.integers(0, 3), label="tail damages")):
            if not tail:
                break
            name = data.draw(st.sampled_from(tail))
            path = os.path.join(base_dir, name)
            if not os.path.exists(path):
                continue
            size = os.path.getsize(path)
            low = max(0, (claimed - int(name)) * UNIT_SIZE)  # what the checkpoint saw stays
            kind = data.draw(st.sampled_from(["cut", "zero", "remove", "garbage"]))
            if kind == "cut" and size > low:
                os.truncate(path, data.draw(st.integers(low, size)))
            elif kind == "zero" and size >= low + UNIT_SIZE:
                at = data.draw(st.integers(low // UNIT_SIZE, size // UNIT_SIZE - 1))
                with open(path, "r+b") as handle:
                    handle.seek(at * UNIT_SIZE)
                    handle.write(bytes(UNIT_SIZE))
            elif kind == "remove" and low == 0:
                os.remove(path)
            elif kind == "garbage":
                with open(path, "ab") as handle:
                    handle.write(b"\x01" * data.draw(st.integers(1, 19)))
        vouched = [n for n in sorted(os.listdir(base_dir)) if int(n) < claimed]
        damage_below = data.draw(st.booleans(), label="a torn or lost file below")
        if vouched and damage_below:
            name = data.draw(st.sampled_from(vouched))
            path = os.path.join(base_dir, name)
            if data.draw(st.booleans()):
                os.remove(path)
            else:
                need = min(per, claimed - int(name)) * UNIT_SIZE
                os.truncate(path, data.draw(st.integers(0, need - 1)))
        scan_dir = os.path.join(root, "scan")
        shutil.copytree(base_dir, scan_dir)
        assert _bounds(base_dir, per, claimed) == _bounds(scan_dir, per, None)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _damaged_a0(fs: SimFileSystem) -> dict[QueueKey, tuple[int, int, bytes]]:
    """Checkpointed queues of 640 units each in 10 KiB files (512 units);
    then A/0's first file torn short, durably, so the next open rebuilds
    A/0. Returns the queues as they were."""
    log = CommitLog.open(NODE, SMALL)
    for seq in range(40):
        _batch(log, seq, per_key=16)
    store = ConsumeQueueStore.open(NODE, log, units_per_file=512)
    store.dispatch_committed(40)
    expected = _queues(store)
    store.close()
    log.close()
    fd = fs.open(os.path.join(NODE, "consumequeue", "A", "0", f"{0:020d}"), os.O_RDWR)
    fs.ftruncate(fd, 100 * UNIT_SIZE)
    fs.fsync(fd)
    fs.close(fd)
    return expected


def _recover_rebuilding_a0() -> None:
    """Open, which rebuilds A/0; the power cut comes before any checkpoint."""
    log = CommitLog.open(NODE, SMALL)
    store = ConsumeQueueStore.open(NODE, log, units_per_file=512)
    assert store.recovery.queues_rebuilt == [("A", 0)]


def _recovered(expected: dict[QueueKey, tuple[int, int, bytes]]) -> None:
    with CommitLog.open(NODE, SMALL) as log:
        store = ConsumeQueueStore.open(NODE, log, units_per_file=512)
        store.dispatch_committed(40)
        assert _queues(store) == expected
        store.close()


def test_a_crash_at_any_point_of_a_recovery_rebuild_is_recovered_from() -> None:
    """Recovery rebuilds a queue a torn file damaged, rewriting slots the
    checkpoint claims; killed at any point of it and the power cut, the next
    open still finds the queue whole or damaged, never wrong."""
    boxes: dict[str, dict[QueueKey, tuple[int, int, bytes]]] = {}

    def setup(fs: SimFileSystem) -> None:
        boxes["expected"] = _damaged_a0(fs)

    def check(_fs: SimFileSystem, _completed: bool) -> None:
        _recovered(boxes["expected"])

    assert crash_points(NODE, setup, lambda _fs: _recover_rebuilding_a0(), check,
                        seeds=2) > 3


def test_a_recovery_rebuild_cut_by_a_power_cut_does_not_pass_for_a_retained_queue() -> None:
    """The rebuild's writes torn by a power cut before they were synced: a
    dropped first page would read as empty leading slots (as if retention
    had removed them) and a queue missing its first 205 units would look
    whole. The rebuild installs each file whole and synced instead."""
    for seed in range(24):
        fs = SimFileSystem(random.Random(seed))
        fs.set_faults(NODE, NO_FAULTS)
        with fileio.use(fs):
            expected = _damaged_a0(fs)
            _recover_rebuilding_a0()
            fs.crash(NODE, random.Random(seed))
            _recovered(expected)


def test_a_recovery_that_cuts_vouched_for_slots_stops_the_checkpoint_vouching() -> None:
    """The log lost entries the checkpoint covered (it was cut after entry
    20 of 40): recovery cuts the queues below the checkpoint's claims, and
    the re-dispatch rewrites those slots unsynced. After a power cut before
    the next checkpoint, files of full length may hold torn pages: the next
    open must scan them, not take their length for the checkpoint's word."""
    torn = 0
    for seed in range(12):
        fs = SimFileSystem(random.Random(seed))
        fs.set_faults(NODE, NO_FAULTS)
        with fileio.use(fs):
            log = CommitLog.open(NODE, SMALL)
            for seq in range(40):
                _batch(log, seq, per_key=16)
            store = ConsumeQueueStore.open(NODE, log, units_per_file=512)  # 10 KiB files
            store.dispatch_committed(40)
            expected = _queues(store)
            store.close()
            log.truncate_after(20)
            log.flush()
            store = ConsumeQueueStore.open(NODE, log, units_per_file=512)
            assert store.offsets("A", 0) == (0, 20 * 16)
            for seq in range(20, 40):
                _batch(log, seq, per_key=16)
            log.flush()
            store.dispatch_committed(40)  # one write per file: 320..511, 512..639
            store.abandon()
            log.close()
            lost = fs.crash(NODE, random.Random(seed))
            torn += lost.get("torn_pages", 0)
            with CommitLog.open(NODE, SMALL) as log:
                store = ConsumeQueueStore.open(NODE, log, units_per_file=512)
                store.dispatch_committed(40)
                assert _queues(store) == expected, f"seed {seed}"
                store.close()
    assert torn  # the seeds did tear the rewritten slots


def test_after_a_failed_fsync_checkpoints_stop_vouching_for_the_files() -> None:
    """A failed fsync may drop the pages (Linux marks them clean): a later
    checkpoint that syncs the same file again makes the newer units durable
    over a hole. It must not let the next open trust that file's length."""
    fs = SimFileSystem(random.Random(3))
    fs.set_faults(NODE, NO_FAULTS)
    with fileio.use(fs):
        log = CommitLog.open(NODE, SMALL)
        for seq in range(5):
            _batch(log, seq, per_key=2)
        log.flush()
        store = ConsumeQueueStore.open(NODE, log, units_per_file=8)
        store.dispatch_committed(2)  # 4 units per queue
        store.checkpoint()
        store.dispatch_committed(3)  # units 4, 5: their sync fails
        fs.set_faults(NODE, DiskFaults(eio_fsync=1.0))
        try:
            store.checkpoint()
        except OSError:
            pass
        else:
            raise AssertionError("the injected fsync error did not surface")
        fs.set_faults(NODE, NO_FAULTS)
        store.dispatch_committed(5)  # units 6..9: file 0 is full now
        expected = _queues(store)
        store.checkpoint()
        cq = os.path.join(NODE, "consumequeue")
        checkpoint = read_dispatch_checkpoint(cq)
        assert checkpoint is not None and not checkpoint.files_synced
        store.abandon()
        log.close()
        fs.crash(NODE, random.Random(0))
        with CommitLog.open(NODE, SMALL) as log:
            store = ConsumeQueueStore.open(NODE, log, units_per_file=8)
            # Units 4 and 5 were lost under a file of full length: found and rebuilt.
            assert sorted(store.recovery.queues_rebuilt) == sorted(KEYS)
            assert _queues(store) == expected
            store.close()


def test_dispatch_checkpoint_round_trips_files_synced_and_reads_an_old_one_as_unvouched(
        tmp_path) -> None:
    d = str(tmp_path)
    write_dispatch_checkpoint(d, DispatchCheckpoint(3, 300, {("A", 0): 7}))
    assert read_dispatch_checkpoint(d) == DispatchCheckpoint(3, 300, {("A", 0): 7}, True)
    write_dispatch_checkpoint(d, DispatchCheckpoint(3, 300, {}, files_synced=False))
    checkpoint = read_dispatch_checkpoint(d)
    assert checkpoint is not None and not checkpoint.files_synced
    # As the version before the key wrote it.
    payload = msgpack.packb({"version": 1, "dispatched_index": 3, "dispatched_end": 300,
                             "queues": [["A", 0, 7]]})
    with open(os.path.join(d, "checkpoint"), "wb") as handle:
        handle.write(payload + struct.pack("<I", crc32c(payload)))
    assert read_dispatch_checkpoint(d) == DispatchCheckpoint(3, 300, {("A", 0): 7}, False)


def _sealed(value: object) -> bytes:
    """`value` as a checkpoint file: msgpack and its CRC, intact."""
    payload = msgpack.packb(value)
    return payload + struct.pack("<I", crc32c(payload))


_GOOD = {"version": 1, "dispatched_index": 5, "dispatched_end": 900,
         "queues": [["A", 0, 20]], "files_synced": True}
DAMAGED_CHECKPOINTS = {
    "bit flip": lambda raw: raw[:3] + bytes([raw[3] ^ 0x10]) + raw[4:],
    "torn to 3 bytes": lambda raw: raw[:3],
    "zeros": lambda raw: bytes(len(raw)),
    "CRC intact, not msgpack": lambda raw: b"\xc1" + struct.pack("<I", crc32c(b"\xc1")),
    "CRC intact, a list": lambda raw: _sealed([1, 2, 3]),
    "CRC intact, no queues": lambda raw: _sealed({**_GOOD, "queues": None}),
    "CRC intact, negative index": lambda raw: _sealed({**_GOOD, "dispatched_index": -1}),
    "CRC intact, a bool for an end": lambda raw: _sealed({**_GOOD, "dispatched_end": True}),
    "CRC intact, a short queue row": lambda raw: _sealed({**_GOOD, "queues": [["A", 0]]}),
    "CRC intact, a queue id as text": lambda raw: _sealed({**_GOOD, "queues": [["A", "0", 1]]}),
    "CRC intact, missing key": lambda raw: _sealed({"version": 1, "queues": []}),
}


def test_a_checkpoint_of_the_right_shape_reads_back() -> None:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "checkpoint"), "wb") as f:
            f.write(_sealed(_GOOD))
        assert read_dispatch_checkpoint(d) == DispatchCheckpoint(5, 900, {("A", 0): 20}, True)


def test_a_damaged_or_forged_checkpoint_is_a_corruption_error() -> None:
    from commitlog.errors import CorruptionError, FormatVersionError

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "checkpoint")
        for name, damage in DAMAGED_CHECKPOINTS.items():
            with open(path, "wb") as f:
                f.write(damage(_sealed(_GOOD)))
            try:
                read_dispatch_checkpoint(d)
            except CorruptionError as error:
                assert "dispatch checkpoint" in str(error), name
            else:
                raise AssertionError(f"{name}: read without an error")
        # A version this code does not know stays a refusal, not damage.
        with open(path, "wb") as f:
            f.write(_sealed({**_GOOD, "version": 2}))
        try:
            read_dispatch_checkpoint(d)
        except FormatVersionError as error:
            assert "unsupported format version 2" in str(error)
        else:
            raise AssertionError("version 2 read without an error")


def test_a_store_with_a_damaged_checkpoint_asks_for_a_rebuild_and_rebuilds_the_same_queues(
) -> None:
    """The checkpoint is unreadable: the store opens anyway, says why, trusts
    no queue file, and `rebuild` with the counts makes the queues exactly as
    they were (here the log is whole, so the counts are the log's)."""
    for name, damage in DAMAGED_CHECKPOINTS.items():
        fs = CountingFS()
        with fileio.use(fs):
            expected = _checkpointed_then_tail(NODE, 30, 4)
            path = os.path.join(NODE, "consumequeue", "checkpoint")
            raw = fs.read_file(path)
            assert raw is not None
            fd = fs.open(path, os.O_RDWR)
            fs.ftruncate(fd, 0)
            fs.pwrite(fd, damage(raw), 0)
            fs.close(fd)
            with CommitLog.open(NODE, SMALL) as log:
                store = ConsumeQueueStore.open(NODE, log, units_per_file=64)
                assert store.recovery.needs_rebuild, name
                assert "dispatch checkpoint" in (store.recovery.checkpoint_damaged or ""), name
                counts = {key: hi for key, (_, hi, _) in expected.items()}
                store.rebuild(log.first_index, 34, counts)
                assert _queues(store) == expected, name
                store.close()
            with CommitLog.open(NODE, SMALL) as log:  # the rebuild wrote a good one
                store = ConsumeQueueStore.open(NODE, log, units_per_file=64)
                assert store.recovery.checkpoint_damaged is None and \
                    not store.recovery.needs_rebuild and store.dispatched_index == 34
                assert _queues(store) == expected
                store.close()
