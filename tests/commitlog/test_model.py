"""The CommitLog against a plain in-memory model, under hypothesis.

Random sequences of append, truncate, flush, checkpoint, clean reopen and
crash. A crash abandons the open log (no sync, no checkpoint) and then damages
only what a real crash may damage: bytes after the checkpoint (cut at a random
byte, or a flipped byte), and unsynced index tails. After every reopen the log
must equal the model's prefix that survived, and never less than the
checkpointed prefix. Corruption *before* the checkpoint must be reported (at
open or on read), never served.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from commitlog import (
    HEADER_SIZE,
    KIND_CONTROL,
    KIND_MESSAGES,
    KIND_NOOP,
    CommitLog,
    CommitLogConfig,
    CorruptionError,
    place,
)
from commitlog.checkpoint import read_checkpoint

SEGMENT = 4096
CONFIG = CommitLogConfig(segment_size_bytes=SEGMENT, index_file_records=4,
                         entry_size_bytes_max=SEGMENT)


class CommitLogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="cl-model-")
        self.log = CommitLog.open(self.dir, CONFIG)
        self.model: list[tuple[int, int, bytes, int]] = []  # (term, kind, body, position)
        self.term = 1

    def teardown(self) -> None:
        if self.log is not None:
            self.log.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------- helpers

    def _end(self, count: int) -> int:
        if count == 0:
            return 0
        _t, _k, body, position = self.model[count - 1]
        return position + HEADER_SIZE + len(body)

    def _checkpointed(self) -> int:
        checkpoint = read_checkpoint(self.dir)
        return checkpoint.durable_index if checkpoint else 0

    def _segment_path(self, base: int) -> str:
        return os.path.join(self.dir, "commitlog", f"{base:020d}")

    def _reopen_expecting(self, survivors: int) -> None:
        self.log = CommitLog.open(self.dir, CONFIG)
        assert self.log.last_index == survivors, (self.log.last_index, survivors)
        del self.model[survivors:]
        self._check_all()

    def _check_all(self) -> None:
        if not self.model:
            assert self.log.last_index == 0
            return
        entries = self.log.read_entries(1, len(self.model) + 1)
        got = [(e.term, e.kind, e.body, e.position) for e in entries]
        assert got == self.model

    # --------------------------------------------------------------- rules

    @rule(bodies=st.lists(st.tuples(st.sampled_from([KIND_MESSAGES, KIND_NOOP, KIND_CONTROL]),
                                    st.binary(max_size=1500)), min_size=1, max_size=4),
          bump=st.booleans())
    def append(self, bodies: list[tuple[int, bytes]], bump: bool) -> None:
        if bump:
            self.term += 1
        items = [(kind, b"" if kind == KIND_NOOP else body) for kind, body in bodies]
        entries = self.log.build_entries(self.term, items)
        self.log.append(entries)
        end = self._end(len(self.model))
        for kind, body in items:
            position = place(end, HEADER_SIZE + len(body), SEGMENT)
            self.model.append((self.term, kind, body, position))
            end = position + HEADER_SIZE + len(body)

    @rule(batches=st.lists(st.tuples(st.booleans(), st.lists(
              st.tuples(st.sampled_from([KIND_MESSAGES, KIND_CONTROL]), st.binary(max_size=1500)),
              min_size=1, max_size=3)), min_size=1, max_size=4))
    def append_new(self, batches: list[tuple[bool, list[tuple[int, bytes]]]]) -> None:
        """The single-writer path: the log places the entries of several batches."""
        plan = []
        for bump, items in batches:
            self.term += bump
            plan.append((self.term, items))
        lasts = self.log.append_new(plan)
        end = self._end(len(self.model))
        for term, items in plan:
            for kind, body in items:
                position = place(end, HEADER_SIZE + len(body), SEGMENT)
                self.model.append((term, kind, body, position))
                end = position + HEADER_SIZE + len(body)
            assert lasts.pop(0) == len(self.model)

    @rule(count=st.integers(3, 12), size=st.integers(500, 1500), seed=st.integers(0, 255))
    def grow(self, count: int, size: int, seed: int) -> None:
        """Many larger entries at once, so logs of several segments are common."""
        self.append([(KIND_MESSAGES, bytes([(seed + i) % 256]) * (size + i))
                     for i in range(count)], bump=False)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        keep = data.draw(st.integers(0, len(self.model)))
        self.log.truncate_after(keep)
        del self.model[keep:]

    @rule()
    def flush(self) -> None:
        assert self.log.flush() == len(self.model)

    @rule()
    def checkpoint(self) -> None:
        self.log.flush()
        self.log.checkpoint()
        assert self._checkpointed() == len(self.model)

    @rule()
    def clean_reopen(self) -> None:
        self.log.close()
        self._reopen_expecting(len(self.model))

    @rule(data=st.data(), flip=st.booleans(), cut_index=st.booleans())
    def crash(self, data: st.DataObject, flip: bool, cut_index: bool) -> None:
        """Lose or tear what was not checkpointed, then recover."""
        self.log.abandon()
        durable = self._checkpointed()
        durable_end = self._end(durable)
        end = self._end(len(self.model))
        cut = data.draw(st.integers(durable_end, end))
        for name in os.listdir(os.path.join(self.dir, "commitlog")):
            base = int(name)
            path = self._segment_path(base)
            if base >= cut and base > 0:
                os.remove(path)
            elif os.path.getsize(path) > cut - base:
                os.truncate(path, max(0, cut - base))
        survivors = sum(1 for n in range(len(self.model)) if self._end(n + 1) <= cut)
        if flip and cut > durable_end:
            at = data.draw(st.integers(durable_end, cut - 1))
            path = self._segment_path(at // SEGMENT * SEGMENT)
            if os.path.exists(path) and os.path.getsize(path) > at % SEGMENT:
                with open(path, "r+b") as handle:
                    handle.seek(at % SEGMENT)
                    byte = handle.read(1)[0]
                    handle.seek(at % SEGMENT)
                    handle.write(bytes([byte ^ (1 << data.draw(st.integers(0, 7)))]))
                hit = next(n for n in range(len(self.model)) if self._end(n + 1) > at)
                survivors = min(survivors, hit)
        if cut_index:
            # Index records after the checkpoint were never synced either.
            index_dir = os.path.join(self.dir, "index")
            for name in os.listdir(index_dir):
                first = int(name)
                path = os.path.join(index_dir, name)
                keep = max(0, (durable - first + 1) * 32)
                size = os.path.getsize(path)
                if size > keep:
                    os.truncate(path, data.draw(st.integers(keep, size)))
        self._reopen_expecting(survivors)
        assert survivors >= durable

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def corrupt_before_checkpoint(self, data: st.DataObject) -> None:
        """A flipped byte in durable data is reported, never served or cut."""
        self.log.close()  # checkpoint covers everything
        # Pick an entry first, so old segments are hit as often as the tail.
        victim = data.draw(st.integers(0, len(self.model) - 1))
        _t, _k, body, position = self.model[victim]
        at = position + data.draw(st.integers(0, HEADER_SIZE + len(body) - 1))
        path = self._segment_path(at // SEGMENT * SEGMENT)
        sizes = {n: os.path.getsize(self._segment_path(int(n)))
                 for n in os.listdir(os.path.join(self.dir, "commitlog"))}
        with open(path, "r+b") as handle:
            handle.seek(at % SEGMENT)
            original = handle.read(1)
            handle.seek(at % SEGMENT)
            handle.write(bytes([original[0] ^ 0xA5]))
        try:
            log = CommitLog.open(self.dir, CONFIG)
        except CorruptionError as error:
            assert error.path == path
        else:
            try:
                raised = False
                try:
                    log.read_entries(1, len(self.model) + 1)
                except CorruptionError:
                    raised = True
                assert raised, "a corrupt entry was served"
            finally:
                log.abandon()
        # Nothing was deleted or cut: undo the flip and everything is back.
        assert sizes == {n: os.path.getsize(self._segment_path(int(n)))
                         for n in os.listdir(os.path.join(self.dir, "commitlog"))}
        with open(path, "r+b") as handle:
            handle.seek(at % SEGMENT)
            handle.write(original)
        self._reopen_expecting(len(self.model))

    @invariant()
    def tail_matches(self) -> None:
        assert self.log.last_index == len(self.model)
        if self.model:
            term, kind, body, position = self.model[-1]
            last = self.log.read_entry(len(self.model))
            assert (last.term, last.kind, last.body, last.position) == (term, kind, body, position)


CommitLogModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCommitLogModel = CommitLogModel.TestCase
