"""A follower never acknowledges entries it cut before the acknowledgement left.

Found by the simulator's slow-disk profile (seed 60, 5 nodes): a follower
accepts an append of term 7 while its previous Ready's fsync is still
running, so the acknowledgement waits in the outbox; before that Ready
completes, a leader of term 9 cuts the acknowledged entry. The old ack of
index 10 then left after the *next* persist, which no longer held index 10,
and the term-7 leader could count it toward a commit. Acknowledgements made
in an older term are now dropped when the Ready is built (a message may be
lost; a false one may not be sent).
"""

from __future__ import annotations

import random

from dledger import AppendRequest, AppendResponse, Config, Entry, EntryKind, RaftNode
from dledger.entry import segment_placement
from dledger.storage import MemoryLogStorage

PLACE = segment_placement()


def chain(terms: list[int]) -> list[Entry]:
    out: list[Entry] = []
    end = 0
    for index, term in enumerate(terms, start=1):
        position = PLACE(end, 48)
        out.append(Entry(index, term, EntryKind.NOOP, b"", position))
        end = position + 48
    return out


def test_ack_of_an_entry_cut_by_a_newer_leader_is_not_sent() -> None:
    follower = RaftNode(Config(node_id=2, voters=frozenset({1, 2, 3})), MemoryLogStorage(),
                        random.Random(1), PLACE)
    old = chain([1, 1])  # from leader 1, term 1
    follower.step(AppendRequest(1, 2, 1, 0, 0, (old[0],), 0))
    in_flight = follower.ready()  # entry 1 being written; its fsync is slow
    follower.step(AppendRequest(1, 2, 1, 1, 1, (old[1],), 0))  # ack of index 2 queued
    new = chain([1, 2])  # leader 3 of term 2 replaces index 2
    follower.step(AppendRequest(3, 2, 2, 1, 1, (new[1],), 0))
    follower.advance(in_flight)
    ready = follower.ready()
    assert ready.entries == (new[1],)
    acks = [m for m in ready.messages + ready.messages_after_persist
            if isinstance(m, AppendResponse) and m.success]
    assert [(m.dst, m.term, m.index) for m in acks] == [(3, 2, 2)]
