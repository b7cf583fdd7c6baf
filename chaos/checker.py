"""Checkers over a history: Jepsen's total-queue categories plus offset checks.

Message identity is the workload's unique `value` (also the message body).
A send is *acknowledged* when its invoke completed `ok`, *failed* when it
completed `fail` (the client knows it was not stored), *unknown* when it
completed `info` or never completed. Messages are seen by `poll` ok ops, live
consumers and the final drain alike.

Categories (counts and the first examples of each are in the result):

- `lost`: acknowledged and not read by the final drain (by any read when the
  history has no drain). A violation. Those a live consumer had read before
  they vanished (a failover or power cut took them back) are also counted
  as `lost_after_consumed` (info).
- `unexpected`: seen but never sent by anyone. A violation.
- `phantom`: seen although its send *failed*. A violation (G1a): "fail" must
  mean "not stored". Seen values whose send was unknown are `recovered`
  (info), never violations.
- `redelivered` (info): the same queue offset delivered more than once, which
  at-least-once consumption allows (rebalance, consumer restart).
- `retry_duplicated`: one value stored at two or more offsets, where its send
  was retried or unknown (an idempotence failure the client could cause).
  Reported separately; not a violation unless `strict_idempotence`.
- `duplicated`: one value at two or more offsets with a single clean attempt:
  the broker stored it twice on its own. A violation.
- `inconsistent_offsets`: one (group, topic, queue, offset) with two values,
  in acks or in reads. A violation (replicas disagree about the queue).
- `skipped_offsets`: an offset inside a queue's [0, highest seen] range that
  nothing ever read, or a gap inside one poll or the drain's sequential
  reads (a within-poll jump is one of those). A violation: consumers would
  never see that message.
- `backward_offsets`: one consumer's offsets of a queue went backwards without
  a rebalance in between (Jepsen's nonmonotonic-poll). Reported, not a
  violation: it re-delivers what was already consumed, which at-least-once
  delivery permits (seen in practice when a consumer fails over to a lagging
  follower and resets to that follower's end). After a rebalance the same
  step is `rebalance_resets` (info). A forward jump is `skipped_offsets`.
- `order`: one producer sent x then y (sequentially) to the same queue and y
  sits at an earlier offset than x. A violation.
- `misplaced_ack`: an acknowledged send named a (group, topic, queue, offset)
  and the value was read, but never there: the acknowledgement lied about
  where the message landed (an offset far beyond the queue, the wrong queue).
  A violation. Acks without an offset (replicate=async) are not judged.
- `body_mismatch`: a read message whose client identity (producer id,
  sequence) names a send, but whose body is not the body sent: another value,
  or the body's CRC32C (`body_crc32c`, recorded by the workload when the send
  was invoked and by every read) or length differs. A violation: the broker
  served bytes nobody sent under that identity.
- `unknown`: sends whose outcome is unknown; never counted as lost.
- `orphan_completion`: a send's completion (ok, fail or info) with no
  invoke open on its process. The history is inconsistent (a harness bug,
  or an edited file): such an acknowledgement pairs with no send, so the
  checker cannot judge it, and says so. A violation.

Retention (a run with `retention=True`): a reader that asks for an offset
retention has deleted is answered "moved forward" and continues at the
queue's first retained offset; the workload records each such jump as a
`moved` op (chaos.moved). Nothing is excused silently:

- `expired` (info, counted and listed): acknowledged, not read by the final
  drain, and the drain was told its offset had been deleted (outside
  retention when read). Judged by chaos.moved.expiry; `lost` remains
  every acknowledged message that was still inside retention when read
  (its offset at or above where the drain was moved to) and is missing.
- `expired_unknown` (info, counted apart): an acknowledged message with no
  known offset whose possible offsets (bounded by the history's real-time
  order) were partly deleted: the checker cannot tell expired from lost.
- `moved_forward` (info): the jumps recorded. A reader's forward step
  across a range it was told was deleted (between the two reads) is not
  `skipped_offsets`, and neither is an offset nobody read that some reader
  was told was deleted.
- `moved_without_retention`: a moved answer in a run without retention
  (nothing may be deleted there). A violation; nothing is excused then.

valid = no lost, unexpected, phantom, duplicated, inconsistent, skipped,
order, misplaced_ack, body_mismatch or orphan_completion anomaly (Jepsen's
total-queue validity plus the offset, placement and body checks, a history
whose every completion has its invoke, and no moved answer in a run
without retention).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.history import Op, pairs
from chaos.moved import Ack, Move, MovedRanges, OffsetBounds, expiry, moves_of

EXAMPLES = 10
VIOLATIONS = ("lost", "unexpected", "phantom", "duplicated", "inconsistent_offsets",
              "skipped_offsets", "order", "misplaced_ack", "body_mismatch",
              "moved_without_retention", "orphan_completion")
INFO = ("lost_after_consumed", "backward_offsets", "recovered", "redelivered",
        "retry_duplicated", "rebalance_resets", "unknown", "expired", "expired_unknown",
        "moved_forward")

QueueKey = tuple[str, str, int]  # (group, topic, queue)


@dataclass
class Seen:
    """One message observed by a read."""

    value: int
    queue: QueueKey
    offset: int
    process: int | str
    time_ns: int
    epoch: int  # the consumer's rebalance count when it saw the message
    drain: bool
    identity: tuple[int, int] | None = None  # (producer_id, sequence) the record carries
    body: tuple[int | None, int | None] = (None, None)  # (CRC32C, length) of the body read
    index: int = -1  # the poll op's place in the history


def _queue_key(v: dict[str, Any]) -> QueueKey | None:
    if v.get("queue") is None:
        return None
    return (str(v.get("group") or ""), str(v.get("topic") or ""), int(v["queue"]))


def messages_of(op: Op) -> list[dict[str, Any]]:
    """The messages a poll op carries (one in `value`, or several in `value.messages`)."""
    value = op.value or {}
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        return [m for m in value["messages"] if isinstance(m, dict)]
    return [value] if isinstance(value, dict) and "value" in value else []


class _Anomalies:
    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.examples: dict[str, list[Any]] = defaultdict(list)

    def add(self, kind: str, example: Any, count: int = 1) -> None:
        self.counts[kind] += count
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)


def check(ops: Sequence[Op], *, strict_idempotence: bool = False,
          retention: bool = False) -> dict[str, Any]:
    """Run every check; returns a JSON-ready dict with `valid` and per-kind results.

    `retention`: the run had retention on, so moved-forward answers may
    excuse unread messages as `expired` (see the module docstring)."""
    out = _Anomalies()
    client_ops = [op for op in ops if not op.is_nemesis]

    # --- sends: attempts, outcomes and where acks say the value went
    attempted: dict[int, dict[str, Any]] = {}
    outcome: dict[int, str] = {}
    retried: set[int] = set()
    acked_order: dict[tuple[Any, QueueKey], list[tuple[int, int]]] = defaultdict(list)
    slot_values: dict[tuple[QueueKey, int], set[int]] = defaultdict(set)
    acked_at: dict[int, tuple[QueueKey, int]] = {}  # value -> where its ack said it landed
    acks: dict[int, tuple[QueueKey | None, int, int]] = {}  # value -> (queue, invoke, done)
    by_identity: dict[tuple[int, int], dict[str, Any]] = {}  # (producer, sequence) -> send
    orphans: list[Op] = []
    for invoke, done in pairs((op for op in client_ops if op.f == "send"), orphans):
        value = _value(invoke.value["value"])
        attempted[value] = invoke.value
        kind = done.type if done is not None else "info"
        outcome[value] = kind
        ident = _identity(invoke.value)
        if ident is not None:
            by_identity[ident] = invoke.value
        done_value = (done.value or {}) if done is not None else {}
        if int(done_value.get("attempts", 1)) > 1 or kind == "info":
            retried.add(value)
        if done is not None and kind == "ok":
            key = _queue_key(done_value)
            acks[value] = (key, invoke.index, done.index)
            if key is not None and done_value.get("offset") is not None:
                slot_values[(key, int(done_value["offset"]))].add(value)
                acked_at[value] = (key, int(done_value["offset"]))
            if key is not None:
                acked_order[(done_value.get("producer_id", invoke.process), key)].append(
                    (done.index, value))

    for op in orphans:
        out.add("orphan_completion", {"process": op.process, "type": op.type,
                                      "index": op.index, "value": op.value})

    # --- reads
    seen: list[Seen] = []
    for op in client_ops:
        if op.f != "poll" or op.type != "ok":
            continue
        epoch = int((op.value or {}).get("epoch", 0)) if isinstance(op.value, dict) else 0
        drain = bool((op.value or {}).get("drain")) if isinstance(op.value, dict) else False
        batch: list[Seen] = []
        for m in messages_of(op):
            key = _queue_key(m)
            if key is None or m.get("offset") is None:
                continue
            batch.append(Seen(_value(m["value"]), key, int(m["offset"]), op.process, op.time_ns,
                              epoch, drain, _identity(m), _body(m), op.index))
        seen.extend(batch)

    seen_values: dict[int, set[tuple[QueueKey, int]]] = defaultdict(set)
    slot_reads: dict[tuple[QueueKey, int], int] = defaultdict(int)
    for s in seen:
        seen_values[s.value].add((s.queue, s.offset))
        slot_values[(s.queue, s.offset)].add(s.value)
        if not s.drain:  # the drain re-reads everything by design
            slot_reads[(s.queue, s.offset)] += 1

    # Moved-forward answers: excuses only in a run with retention.
    moves = moves_of(client_ops)
    for move in moves:
        jump = {"queue": list(move.queue), "from": move.start, "to": move.to,
                "process": move.process}
        out.add("moved_forward", {**jump, "drain": move.drain})
        if not retention:
            out.add("moved_without_retention", jump)
    excuses = moves if retention else []

    # lost: judged by the drain when there was one (a message consumed live and
    # then dropped by a failover or a power cut is lost too), else by all reads.
    drained = {s.value for s in seen if s.drain}
    has_drain = bool(drained) or any(m.drain for m in moves)
    final = drained if has_drain else set(seen_values)
    judging = MovedRanges(m for m in excuses if m.drain or not has_drain)
    expired = _judge_unread(outcome, final, acks, acked_at, seen, judging, attempted,
                            seen_values, out)
    for value, slots in seen_values.items():
        where = [[*q, o] for q, o in sorted(slots)][:3]
        if value not in attempted:
            out.add("unexpected", {"value": value, "at": where})
        elif outcome[value] == "fail":
            out.add("phantom", {"value": value, "at": where})
        elif outcome[value] == "info":
            out.add("recovered", {"value": value, "at": where})
    unknown = [v for v, k in outcome.items() if k == "info"]
    for value in unknown:
        out.add("unknown", {"value": value, "seen": value in seen_values})

    # one value at several offsets
    for value, slots in seen_values.items():
        if len(slots) > 1:
            kind = "retry_duplicated" if value in retried else "duplicated"
            out.add(kind, {"value": value, "at": [[*q, o] for q, o in sorted(slots)]},
                    count=len(slots) - 1)
    # one offset read more than once
    for (q, o), reads in slot_reads.items():
        if reads > 1:
            out.add("redelivered", {"queue": list(q), "offset": o, "reads": reads},
                    count=reads - 1)
    # one offset, two values
    for (q, o), values in slot_values.items():
        if len(values) > 1:
            out.add("inconsistent_offsets", {"queue": list(q), "offset": o,
                                             "values": sorted(values, key=str)})

    # where an ack said a value landed, against where it was read
    for value, (q, o) in acked_at.items():
        read_at = seen_values.get(value)
        if read_at and (q, o) not in read_at:
            out.add("misplaced_ack", {"value": value, "acked_at": [*q, o],
                                      "read_at": [[*sq, so] for sq, so in sorted(read_at)][:3]})
    _check_bodies(seen, by_identity, out)
    _check_coverage(seen, out, MovedRanges(excuses))
    _check_consumer_order(seen, out, excuses)
    final_offset = _final_offsets(seen)
    _check_send_order(acked_order, final_offset, out)

    if strict_idempotence and out.counts.get("retry_duplicated"):
        out.counts["duplicated"] += out.counts["retry_duplicated"]

    acked = sum(1 for k in outcome.values() if k == "ok")
    counts = {k: out.counts.get(k, 0) for k in (*VIOLATIONS, *INFO)}
    bad = [k for k in VIOLATIONS if counts[k]]
    return {
        "valid": not bad,
        "bad_kinds": bad,
        "counts": counts,
        "examples": {k: out.examples[k] for k in (*VIOLATIONS, *INFO) if out.examples.get(k)},
        "sends": {"attempted": len(attempted), "acknowledged": acked,
                  "failed": sum(1 for k in outcome.values() if k == "fail"),
                  "unknown": len(unknown),
                  "unknown_seen": sum(1 for v in unknown if v in seen_values)},
        "reads": {"messages": len(seen), "distinct_values": len(seen_values),
                  "drain": sum(1 for s in seen if s.drain)},
        "retention": {"checked_with_retention": retention, "moves": len(moves),
                      "drain_moves": sum(1 for m in moves if m.drain),
                      "expired": counts["expired"], "expired_read_live": expired,
                      "expired_unknown": counts["expired_unknown"],
                      "drain_floor": {"/".join(map(str, q)): judging.floor(q)
                                      for q in judging.queues()}},
    }


def _judge_unread(outcome: dict[int, str], final: set[int],
                  acks: dict[int, tuple[QueueKey | None, int, int]],
                  acked_at: dict[int, tuple[QueueKey, int]], seen: Sequence[Seen],
                  judging: MovedRanges, attempted: dict[int, dict[str, Any]],
                  seen_values: dict[int, set[tuple[QueueKey, int]]], out: _Anomalies) -> int:
    """`lost`, `expired` or `expired_unknown` for every acknowledged message the
    judging reads did not return; returns how many expired ones a consumer had read."""
    read_at: dict[int, tuple[QueueKey, int]] = {}
    for s in seen:  # the lowest offset a value was read at, in its ack's queue
        queue = acks.get(s.value, (None, 0, 0))[0]
        if s.queue == queue and (s.value not in read_at or s.offset < read_at[s.value][1]):
            read_at[s.value] = (s.queue, s.offset)
    known: list[Ack] = []
    missing: list[Ack] = []
    for value, kind in outcome.items():
        if kind != "ok" or value not in acks:
            continue
        queue, invoked, done = acks[value]
        where = acked_at.get(value) or read_at.get(value)
        ack = Ack(value, str(attempted[value].get("topic") or ""), queue,
                  where[1] if where is not None else None, invoked, done)
        known.append(ack)
        if value not in final:
            missing.append(ack)
    bounds = OffsetBounds(known) if missing else OffsetBounds(())
    read_live = 0
    for ack in missing:
        verdict, place = expiry(ack, judging, bounds)
        consumed = ack.value in seen_values
        example = {"value": ack.value, **place, **_brief(attempted[ack.value])}
        if verdict == "lost":
            out.add("lost", {**example, "consumed_before_loss": consumed})
            if consumed:
                out.add("lost_after_consumed", {"value": ack.value})
        else:
            out.add(verdict, {**example, "read_live": consumed})
            read_live += verdict == "expired" and consumed
    return read_live


def _value(raw: Any) -> Any:
    """Values are integers; anything else read back (a foreign body) stays a string."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        return str(raw)


def _identity(v: dict[str, Any]) -> tuple[int, int] | None:
    """(producer_id, sequence) of a send or a read; None without a producer id."""
    try:
        producer = int(v.get("producer_id") or 0)
        sequence = int(v.get("sequence") or 0)
    except (TypeError, ValueError):
        return None
    return (producer, sequence) if producer else None


def _body(v: dict[str, Any]) -> tuple[int | None, int | None]:
    crc, length = v.get("body_crc32c"), v.get("body_len")
    return (None if crc is None else int(crc), None if length is None else int(length))


def _check_bodies(seen: Iterable[Seen], sends: dict[tuple[int, int], dict[str, Any]],
                  out: _Anomalies) -> None:
    """Each read of a sent identity must carry the value and body bytes that were sent.

    Bodies are compared by the CRC32C and length both sides recorded (older
    histories without them are compared by value only).
    """
    reported: set[tuple[tuple[int, int], QueueKey, int]] = set()
    for s in seen:
        if s.identity is None:
            continue
        sent = sends.get(s.identity)
        if sent is None:
            continue
        want = _body(sent)
        wrong = []
        if _value(sent.get("value")) != s.value:
            wrong.append("value")
        for name, a, b in (("body_crc32c", want[0], s.body[0]), ("body_len", want[1], s.body[1])):
            if a is not None and b is not None and a != b:
                wrong.append(name)
        where = (s.identity, s.queue, s.offset)
        if wrong and where not in reported:
            reported.add(where)
            out.add("body_mismatch", {"producer_id": s.identity[0], "sequence": s.identity[1],
                                      "at": [*s.queue, s.offset], "differs": wrong,
                                      "sent": {"value": sent.get("value"),
                                               "body_crc32c": want[0], "body_len": want[1]},
                                      "read": {"value": s.value, "body_crc32c": s.body[0],
                                               "body_len": s.body[1]}})


def _brief(invoke_value: dict[str, Any]) -> dict[str, Any]:
    return {k: invoke_value[k] for k in ("topic", "producer_id", "sequence")
            if k in invoke_value}


def _check_coverage(seen: Iterable[Seen], out: _Anomalies, moved: MovedRanges) -> None:
    """Every offset from 0 to the highest read of a queue must have been read,
    or some reader told it had been deleted (`moved`)."""
    offsets: dict[QueueKey, set[int]] = defaultdict(set)
    for s in seen:
        offsets[s.queue].add(s.offset)
    for q, got in sorted(offsets.items()):
        missing = [o for o in range(max(got) + 1) if o not in got and not moved.covers(q, o)]
        if missing:
            out.add("skipped_offsets", {"queue": list(q), "never_read": missing[:20],
                                        "count": len(missing)}, count=len(missing))


def _check_consumer_order(seen: Iterable[Seen], out: _Anomalies,
                          moves: Sequence[Move] = ()) -> None:
    """Per consumer and queue, offsets advance by one between reads of one
    assignment, or across what this reader was told had been deleted in
    between (`moves`)."""
    by_reader: dict[tuple[int | str, QueueKey], list[Move]] = defaultdict(list)
    for m in moves:
        by_reader[(m.process, m.queue)].append(m)
    last: dict[tuple[int | str, QueueKey], Seen] = {}
    for s in seen:
        key = (s.process, s.queue)
        prev = last.get(key)
        last[key] = s
        if prev is None or s.offset == prev.offset + 1:
            continue
        if s.epoch != prev.epoch:
            out.add("rebalance_resets", {"queue": list(s.queue), "process": s.process,
                                         "from": prev.offset, "to": s.offset})
        elif s.offset <= prev.offset:
            out.add("backward_offsets", {"queue": list(s.queue), "process": s.process,
                                         "from": prev.offset, "to": s.offset})
        elif MovedRanges(m for m in by_reader.get(key, ())
                         if prev.index < m.index < s.index).covers_all(
                             s.queue, prev.offset + 1, s.offset):
            continue  # told those offsets were deleted, between the two reads
        else:
            out.add("skipped_offsets", {"queue": list(s.queue), "process": s.process,
                                        "from": prev.offset, "to": s.offset})


def _final_offsets(seen: Iterable[Seen]) -> dict[int, tuple[QueueKey, int]]:
    """Where each value sits (its lowest offset; duplicates are reported elsewhere)."""
    best: dict[int, tuple[QueueKey, int]] = {}
    for s in seen:
        cur = best.get(s.value)
        if cur is None or (s.queue, s.offset) < cur:
            best[s.value] = (s.queue, s.offset)
    return best


def _check_send_order(acked_order: dict[tuple[Any, QueueKey], list[tuple[int, int]]],
                      final_offset: dict[int, tuple[QueueKey, int]], out: _Anomalies) -> None:
    """A sequential producer's acked sends to one queue sit at increasing offsets."""
    for (producer, q), sends in acked_order.items():
        previous: tuple[int, int] | None = None  # (value, offset)
        for _index, value in sorted(sends):
            where = final_offset.get(value)
            if where is None or where[0] != q:
                continue
            if previous is not None and where[1] < previous[1]:
                out.add("order", {"queue": list(q), "producer": producer,
                                  "earlier": {"value": previous[0], "offset": previous[1]},
                                  "later": {"value": value, "offset": where[1]}})
            previous = (value, where[1])
