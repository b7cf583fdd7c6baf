"""SEND_MESSAGES: a send request's records become one group-commit
proposal, and its answer says where each record went.

Idempotency lives here: a record whose (producer, sequence) the state
machine already stored is answered as a duplicate with its original
location, one in flight in another request waits for that request's
result, and a repeat within the request copies its earlier twin. A request
of records the node can store at once is checked in the connection's read
loop and answered from its proposal's future, without a task (the
per-message path, docs/architecture.md "Handlers, tasks and
backpressure"); anything that has to wait (a failover hold, a topic being
auto-created, a record in flight elsewhere, the msgpack `messages` form)
goes on in a coroutine.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from commitlog.errors import MessageTooLargeError as StorageTooLarge
from ledgermq.base.errors import InvalidRequestError, MessageTooLargeError
from ledgermq.broker.acl import Action
from ledgermq.broker.codec import Records, Scanned, encode_wire_message, message_id, scan_records
from ledgermq.broker.request_checks import Body, RequestChecks, body_map
from ledgermq.broker.state import Stored
from ledgermq.broker.view import BrokerView, SendAck
from ledgermq.wire import Connection
from ledgermq.wire.rpc import Reply

_QUEUE_ID = struct.Struct("<I")

Ident = tuple[int, int]  # (producer_id, sequence); producer 0: not idempotent


@dataclass(frozen=True, slots=True)
class _Stored:
    """A send request's new records as group commit stored them."""

    ack: SendAck
    records: Records


# A record's result, to be read from the request that stores it: (its
# request's future, its index among that request's new records).
_InFlight = tuple["asyncio.Future[_Stored]", int]


@dataclass(slots=True)
class _Storing:
    """A send request on its way through group commit (SendHandler._store_start):
    what it proposed and what its duplicates wait for."""

    records: Records  # the records proposed: all, or the new ones
    submitted: asyncio.Future[SendAck] | None  # their proposal; None: nothing new
    # Set when some records are duplicates: a result per record, the indexes
    # of the new ones, retries of records in flight elsewhere (index, where
    # to read the result) and repeats within the request (index, earlier index).
    results: list[Body | None] | None
    fresh_at: list[int] | None
    waits: list[tuple[int, _InFlight]]
    repeats: list[tuple[int, int]]
    # What this request put in flight, and the future other requests that
    # retry one of its records wait on.
    mine: list[tuple[Ident, _InFlight]]
    shared: asyncio.Future[_Stored] | None
    # All new, proposed through group commit's completion callback: no
    # `submitted` future; the answer goes out from the callback.
    answered_by_then: bool


def _records_answer(scanned: Scanned, results: list[Body] | None,
                    done: _Stored | None) -> Body:
    """The answer to a `records` send: a result per record when some were
    duplicates; else O(1) per request, because the client knows every
    record's size and queue: the first record's position and each queue's
    first offset say it all."""
    if results is not None:
        return {"results": results}
    assert done is not None
    first, stored, record = done.ack
    return {"base": first, "queue_offsets": None if stored is None else [
        stored.queue_offset(record + i) for i in scanned.firsts]}


def _filled(result: Body | None) -> Body:
    assert result is not None, "every record of a request gets a result"
    return result


class SendHandler(RequestChecks):
    """The send request, with the records it has in flight."""

    def __init__(self, broker: BrokerView) -> None:
        super().__init__(broker)
        self._inflight_seq: dict[Ident, _InFlight] = {}
        # Highest sequence ever put in flight per producer (a lower bound for
        # "is anything of this request already in flight?"; never too low).
        self._inflight_high: dict[int, int] = {}

    def _result(self, stored: Stored | None) -> Body:
        if stored is None:
            return {"msg_id": None, "queue_id": None, "queue_offset": None, "duplicate": True}
        return {"msg_id": message_id(self.b.config.group, stored.physical_offset),
                "queue_id": stored.queue_id, "queue_offset": stored.queue_offset,
                "duplicate": True}

    def _stored_result(self, done: _Stored, k: int, duplicate: bool) -> Body:
        """The result map of record `k` of a stored `Records` (see _store)."""
        ack, records = done.ack, done.records
        start = records.starts[k]
        if ack.stored is not None:
            where = ack.location(k)
            queue_id, queue_offset = where.queue_id, where.queue_offset
        else:
            queue_id, queue_offset = _QUEUE_ID.unpack_from(records.blob, start + 4)[0], None
        return {"msg_id": message_id(self.b.config.group, ack.first + start), "queue_id": queue_id,
                "queue_offset": queue_offset, "duplicate": duplicate}

    def send(self, body: Any, conn: Connection) -> Awaitable[Any] | Reply:
        """SEND_MESSAGES. A request of records this node can store at once
        (it is the ready leader, its topics exist, none of its records is
        being stored by another request) is checked here and answered from
        its proposal's future, without a task (the per-message path); any
        other request goes on in a coroutine."""
        body = body_map(body)
        if "records" in body:
            return self._send_records(body, conn)
        return self._send_messages(body, conn)

    async def _send_messages(self, body: Body, conn: Connection) -> Body:
        """SEND_MESSAGES with `messages`: msgpack maps, encoded here."""
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise InvalidRequestError("field 'messages' must be a non-empty list")
        await self._writable()
        self._require_space()
        limit = self.b.config.message_size_bytes_max
        messages = []
        for i, m in enumerate(raw):
            try:
                messages.append(encode_wire_message(m, limit))
            except StorageTooLarge as exc:
                raise MessageTooLargeError(
                    f"message {i} of {exc.size} bytes exceeds message_size_bytes_max {limit}",
                    data={"index": i, "size": exc.size, "limit": limit}) from None
        for topic in sorted({m.topic for m in messages}):
            self._allow(conn, Action.PUB, topic)
        for topic in {m.topic for m in messages}:
            config = await self._topic_for_write(topic)
            for m in messages:
                if m.topic == topic and m.queue_id >= config.queues:
                    raise InvalidRequestError(
                        f"queue {m.queue_id} does not exist: topic {topic!r} has"
                        f" {config.queues} queues")
        starts = []
        at = 0
        for m in messages:
            starts.append(at)
            at += len(m.record)
        records = Records(b"".join(m.record for m in messages), starts)
        results, done = await self._store(records, [(m.producer_id, m.sequence)
                                                    for m in messages])
        if results is None:
            assert done is not None
            results = [self._stored_result(done, k, False) for k in range(len(messages))]
        return {"results": results}

    def _send_records(self, body: Body, conn: Connection) -> Awaitable[Body] | Reply:
        """SEND_MESSAGES with `records`: the client's CommitLog records as one
        blob, checked in one pass and stored as they are (docs/protocol.md)."""
        limit = self.b.config.message_size_bytes_max
        scanned = scan_records(body["records"], limit)
        count = body.get("count")
        if count is not None and count != len(scanned.starts):
            raise InvalidRequestError(
                f"field 'count' is {count!r} but the blob holds {len(scanned.starts)} records")
        for topic in scanned.topics:
            self._allow(conn, Action.PUB, topic)
        if not self.b.writable() or not scanned.topics.keys() <= self.b.state.topics.keys():
            return self._send_records_later(body, scanned)
        return self._store_records(body, scanned)

    async def _send_records_later(self, body: Body, scanned: Scanned) -> Body:
        """A send that waits for a leader or for its topics to be created."""
        await self._writable()
        self._require_space()
        for topic in scanned.topics:
            await self._topic_for_write(topic)
        stored = self._store_records(body, scanned, in_task=True)
        assert not isinstance(stored, Reply)
        return await stored

    def _store_records(self, body: Body, scanned: Scanned,
                       in_task: bool = False) -> Awaitable[Body] | Reply:
        self._require_space()
        for topic, top in scanned.topics.items():
            config = self._existing_topic_for_write(topic)
            if top >= config.queues:
                raise InvalidRequestError(
                    f"queue {top} does not exist: topic {topic!r} has {config.queues} queues")
        reply = Reply()
        storing = self._store_start(
            Records(body["records"], scanned.starts, scanned.columns), scanned.idents,
            None if in_task else partial(self._records_stored, scanned, reply))
        if storing.answered_by_then:
            return reply
        return self._records_answer_later(scanned, self._store_wait(storing))

    def _records_stored(self, scanned: Scanned, reply: Reply, storing: _Storing,
                        ack: SendAck | None, error: BaseException | None) -> None:
        """The proposal of a request of new records ended (group commit's
        completion, in the pass that committed it): its answer, at once."""
        if error is None:
            assert ack is not None
            outcome = self._settled(storing, _Stored(ack, storing.records))
        else:
            outcome = self._settled(storing, error)
        if reply.done:
            return  # the connection closed
        if isinstance(outcome, asyncio.CancelledError):
            reply.cancel()
        elif isinstance(outcome, BaseException):
            reply.fail(outcome)
        else:
            try:
                body = _records_answer(scanned, None, outcome)
            except Exception as exc:  # our bug: answered INTERNAL, not left hanging
                reply.fail(exc)
            else:
                reply.resolve(body)

    async def _records_answer_later(
            self, scanned: Scanned,
            storing: Awaitable[tuple[list[Body] | None, _Stored | None]]) -> Body:
        results, done = await storing
        return _records_answer(scanned, results, done)

    def _all_new(self, idents: list[Ident]) -> bool:
        """True when every record is an idempotent one of one producer, in
        increasing sequence, above anything stored or in flight for it: the
        normal request, which then needs no per-record duplicate check."""
        producer_id, first = idents[0]
        if not producer_id:
            return False
        if (first <= self._inflight_high.get(producer_id, -1)
                or first <= self.b.state.producers.high(producer_id)):
            return False
        previous = first
        for pid, seq in idents[1:]:
            if pid != producer_id or seq <= previous:
                return False
            previous = seq
        return True

    def _note_inflight_high(self, mine: list[tuple[Ident, _InFlight]]) -> None:
        highs = self._inflight_high
        if len(highs) > 100_000:
            highs.clear()  # only makes _all_new answer False until refilled
        for (producer_id, seq), _ in mine:
            if seq > highs.get(producer_id, -1):
                highs[producer_id] = seq

    async def _store(self, records: Records, idents: list[Ident]
                     ) -> tuple[list[Body] | None, _Stored | None]:
        """Store the records whose (producer_id, sequence) is new.

        Returns (None, done) when every record was new and stored, `done`
        saying where they went; otherwise (a result map per record, done or
        None when nothing was new).
        """
        return await self._store_wait(self._store_start(records, idents))

    def _store_start(self, records: Records, idents: list[Ident],
                     then: Callable[[_Storing, SendAck | None, BaseException | None], None]
                     | None = None) -> _Storing:
        """Sort a request's records into new ones, which go to group commit
        now, and duplicates (stored before, in flight in another request, or
        repeated within this one). With `then`, a request whose records are
        all new hands its outcome to `then(storing, ack, error)` from group
        commit's completion (`answered_by_then`) instead of a future."""
        all_new = self._all_new(idents)
        if all_new:
            # The normal request: no per-record lookups.
            storing = _Storing(records, None, None, None, [], [], [], None, False)
        else:
            storing = self._sort_duplicates(records, idents)
            if storing.fresh_at is not None:
                if not storing.fresh_at:
                    return storing  # nothing new
                idents = [idents[i] for i in storing.fresh_at]
                records = storing.records
        total = len(records.blob)
        if total + 64 > self.b.entry_limit:
            raise MessageTooLargeError(
                f"batch of {total} bytes exceeds the entry limit {self.b.entry_limit}",
                data={"limit": self.b.entry_limit})
        # One future for the whole request: a concurrent retry of any of its
        # idempotent messages waits on it and takes its own slot.
        shared: asyncio.Future[_Stored] = asyncio.get_running_loop().create_future()
        mine = [(key, (shared, k)) for k, key in enumerate(idents) if key[0]]
        storing.mine, storing.shared = mine, shared
        self._inflight_seq.update(mine)
        if mine:
            # All new: increasing, so the last is the highest.
            self._note_inflight_high(mine[-1:] if all_new else mine)
        assert self.b.sends is not None
        try:
            if then is not None and storing.fresh_at is None:
                storing.answered_by_then = True
                self.b.sends.submit_then(records, total, len(records.starts),
                                         partial(then, storing))
            else:
                storing.submitted = self.b.sends.submit(records, total, len(records.starts))
        except BaseException as exc:
            self._settled(storing, exc)
            raise
        return storing

    def _sort_duplicates(self, records: Records, idents: list[Ident]) -> _Storing:
        """`_store_start`'s look at each record of a request that may hold
        duplicates: the result of each one stored before, what waits for
        records in flight elsewhere or repeated within the request, and the
        new records (`fresh_at`, and `records` cut down to them; `fresh_at`
        stays None when every record is new)."""
        results: list[Body | None] | None = None
        fresh_at: list[int] | None = None
        waits: list[tuple[int, _InFlight]] = []
        repeats: list[tuple[int, int]] = []  # (index, index of the same identity earlier)
        first_of: dict[tuple[int, int], int] = {}
        lookup = self.b.state.producers.lookup
        inflight = self._inflight_seq
        for i, key in enumerate(idents):
            if key[0]:
                known, stored = lookup(key[0], key[1])
                earlier = None if known else inflight.get(key)
                if known or earlier is not None or key in first_of:
                    if fresh_at is None:
                        fresh_at = list(range(i))
                        results = [None] * len(idents)
                    assert results is not None
                    if known:
                        results[i] = self._result(stored)
                    elif earlier is not None:
                        waits.append((i, earlier))
                    else:
                        repeats.append((i, first_of[key]))
                    continue
                first_of[key] = i
            if fresh_at is not None:
                fresh_at.append(i)
        if fresh_at:
            # Some records are duplicates: store the others only.
            blob, starts = records.blob, records.starts
            ends = [*starts[1:], len(blob)]
            parts = [blob[starts[i] : ends[i]] for i in fresh_at]
            sub_starts = []
            at = 0
            for part in parts:
                sub_starts.append(at)
                at += len(part)
            records = Records(b"".join(parts), sub_starts)
        return _Storing(records, None, results, fresh_at, waits, repeats, [], None, False)

    def _settle(self, storing: _Storing) -> _Stored | BaseException:
        """The request's proposal ended: where its records went, or why not."""
        submitted = storing.submitted
        assert submitted is not None and submitted.done()
        if submitted.cancelled():
            return self._settled(storing, asyncio.CancelledError())
        error = submitted.exception()
        if error is not None:
            return self._settled(storing, error)
        return self._settled(storing, _Stored(submitted.result(), storing.records))

    def _settled(self, storing: _Storing, outcome: _Stored | BaseException
                 ) -> _Stored | BaseException:
        """Take the request's records out of flight and tell the retries
        waiting on them."""
        inflight = self._inflight_seq
        for key, _ in storing.mine:
            inflight.pop(key, None)
        shared = storing.shared
        if shared is not None and not shared.done():
            if isinstance(outcome, BaseException):
                shared.set_exception(outcome)
                shared.exception()  # retrieved: there may be no waiter
            else:
                shared.set_result(outcome)
        return outcome

    async def _store_wait(self, storing: _Storing) -> tuple[list[Body] | None, _Stored | None]:
        """`_store`'s answer, once the request's proposal and the other
        requests its duplicates wait for have ended."""
        done = None
        submitted = storing.submitted
        if submitted is not None:
            try:
                await submitted
            finally:
                outcome = self._settle(storing)
            if isinstance(outcome, BaseException):
                raise outcome
            done = outcome
        results = storing.results
        for i, (future, k) in storing.waits:
            assert results is not None
            results[i] = self._stored_result(await asyncio.shield(future), k, True)
        return self._results(storing, done), done

    def _results(self, storing: _Storing, done: _Stored | None) -> list[Body] | None:
        """A result per record, or None when every record was new (then
        `done` says it all); the retries' results are in already."""
        results = storing.results
        if results is None:
            return None
        if done is not None:
            assert storing.fresh_at is not None
            for k, i in enumerate(storing.fresh_at):
                results[i] = self._stored_result(done, k, False)
        for i, j in storing.repeats:
            results[i] = dict(_filled(results[j]), duplicate=True)  # j < i: filled above
        return [_filled(r) for r in results]
