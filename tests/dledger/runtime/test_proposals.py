"""Proposals' outcomes and followers' apply batches on the real runtime:
`propose_then` completions (told once, after the entry is applied on the
leader, never inside a Ready, also from a completion that proposes again),
deadlines without a timer per proposal, and `follower_apply_delay_ms`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from node_harness import Cluster, wait_until

import commitlog
from dledger.runtime.node import NotLeaderError, ProposalUnknown, RaftGroupNode
from ledgermq.base.loop import run

pytestmark = pytest.mark.timeout(120)

Outcome = tuple[commitlog.Entry | None, BaseException | None]


def test_completions_come_once_after_the_apply_and_may_propose_again(tmp_path: Path) -> None:
    """Each completion is called once, with the entry its proposal became,
    after the leader applied it (replicate=sync's ack point). A completion
    that proposes the next entry (as the broker's group commit does when a
    batch ends) chains 50 proposals, in order, each told once."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            applied = cluster.applied[leader.config.node_id]
            outcomes: list[tuple[int, Outcome]] = []
            done = asyncio.get_running_loop().create_future()

            def then(k: int, entry: commitlog.Entry | None, error: BaseException | None) -> None:
                outcomes.append((k, (entry, error)))
                assert entry is not None and error is None
                assert entry.index in {e.index for e in applied}, "told before applied"
                if k + 1 < 50:
                    leader.propose_then(commitlog.KIND_MESSAGES, b"chain-%d" % (k + 1),
                                        lambda e, x: then(k + 1, e, x))
                else:
                    done.set_result(None)

            leader.propose_then(commitlog.KIND_MESSAGES, b"chain-0", lambda e, x: then(0, e, x))
            async with asyncio.timeout(20):
                await done
            assert [k for k, _ in outcomes] == list(range(50))
            entries = [outcome[0] for _, outcome in outcomes]
            assert [e.body for e in entries if e] == [b"chain-%d" % k for k in range(50)]
            indexes = [e.index for e in entries if e]
            assert indexes == sorted(indexes) and len(set(indexes)) == 50
        finally:
            await cluster.stop_all()

    run(main())


def test_a_one_node_group_completes_before_propose_then_returns(tmp_path: Path) -> None:
    """While the driver idles the round runs in the caller's pass: on a
    one-node group the entry commits in that round, so the completion has
    run by the time `propose_then` returns (a caller must expect that)."""
    async def main() -> None:
        cluster = Cluster(tmp_path, n=1, flush="async")
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            await asyncio.sleep(0.05)  # let the driver go idle
            told: list[Outcome] = []
            leader.propose_then(commitlog.KIND_MESSAGES, b"x", lambda e, x: told.append((e, x)))
            assert len(told) == 1 and told[0][0] is not None and told[0][0].body == b"x"
        finally:
            await cluster.stop_all()

    run(main())


def test_a_proposal_past_its_deadline_is_unknown_once(tmp_path: Path) -> None:
    """No quorum (both followers stopped): the completion and the future
    get ProposalUnknown once the deadline passed (checked each tick), and a
    quorum coming back later does not tell them a second time."""
    async def main() -> None:
        cluster = Cluster(tmp_path, tick_ms=20, election_timeout_ticks=50)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            followers = [n for n, node in cluster.nodes.items() if node is not leader]
            for node_id in followers:
                await cluster.stop(node_id)
            told: list[Outcome] = []
            loop = asyncio.get_running_loop()
            started = loop.time()
            leader.propose_then(commitlog.KIND_MESSAGES, b"lost", lambda e, x: told.append((e, x)),
                                timeout=0.3)
            future = leader.propose_nowait(commitlog.KIND_MESSAGES, b"lost too", timeout=0.3)
            with pytest.raises(ProposalUnknown):
                await future
            await wait_until(lambda: told, 5, "the completion")
            # uvloop's clock counts whole milliseconds: the deadline itself
            # can read as a hair under 0.3 s after `started`.
            assert loop.time() - started >= 0.3 - 1e-6
            assert len(told) == 1 and told[0][0] is None
            assert isinstance(told[0][1], ProposalUnknown)
            for node_id in followers:
                await cluster.start(node_id)
            await wait_until(lambda: leader.commit_index >= leader.last_index, 15,
                             "the entries committed after all")
            await asyncio.sleep(0.1)
            assert len(told) == 1
        finally:
            await cluster.stop_all()

    run(main())


def test_a_follower_refuses_propose_then_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            follower = next(n for n in cluster.nodes.values() if n is not leader)
            with pytest.raises(NotLeaderError) as info:
                follower.propose_then(commitlog.KIND_MESSAGES, b"x", lambda e, x: None)
            assert info.value.leader_id == leader.config.node_id
        finally:
            await cluster.stop_all()

    run(main())


async def _commit(leader: RaftGroupNode, n: int) -> int:
    entries = await asyncio.gather(*(leader.propose(commitlog.KIND_MESSAGES, b"m%d" % i)
                                     for i in range(n)))
    return max(e.index for e in entries)


def test_followers_apply_in_batches_and_catch_up_within_the_delay(tmp_path: Path) -> None:
    """With a long follower_apply_delay_ms the followers' state machines
    lag the commit for a while, then take the entries in a few calls, in
    order; the leader applies every entry before it acknowledges it."""
    async def main() -> None:
        cluster = Cluster(tmp_path, follower_apply_delay_ms=400)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            await cluster.wait_converged()
            calls: dict[int, int] = {}
            for node_id, node in cluster.nodes.items():
                def counting(entries, node_id=node_id, inner=node._apply_cb):  # type: ignore[no-untyped-def]
                    calls[node_id] = calls.get(node_id, 0) + 1
                    inner(entries)
                node._apply_cb = counting
            last = 0
            for _ in range(20):
                last = await _commit(leader, 1)
            followers = [n for n in cluster.nodes.values() if n is not leader]
            assert leader.applied_index == last
            assert all(f.applied_index < last for f in followers), "applied before the delay"
            await wait_until(lambda: all(f.applied_index == last for f in followers), 5,
                             "the followers' batches")
            for node_id, node in cluster.nodes.items():
                indexes = [e.index for e in cluster.applied[node_id]]
                assert indexes == list(range(1, last + 1))
                if node is not leader:
                    assert calls[node_id] <= 3, calls  # 20 entries in a batch or a few
        finally:
            await cluster.stop_all()

    run(main())


def test_a_follower_hands_over_its_batch_when_it_leads_or_stops(tmp_path: Path) -> None:
    """A follower's pending batch is applied before it may lead (the new
    leader's state has every entry it committed before its own term's
    entry) and when it stops."""
    async def main() -> None:
        cluster = Cluster(tmp_path, follower_apply_delay_ms=60_000)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            last = await _commit(leader, 30)
            followers = [n for n, node in cluster.nodes.items() if node is not leader]
            await wait_until(lambda: all(cluster.nodes[f].commit_index >= last
                                         for f in followers), 10, "the commit on the followers")
            assert all(cluster.nodes[f].applied_index < last for f in followers)
            # Stop one follower: its batch goes to its state machine first.
            stopped = followers[0]
            await cluster.stop(stopped)
            assert [e.index for e in cluster.applied[stopped]][-1] >= last
            # Stop the leader: the other follower wins and applies what it held.
            await cluster.stop(leader.config.node_id)
            await cluster.start(stopped)
            new = await cluster.wait_leader(timeout=30)
            indexes = [e.index for e in cluster.applied[new.config.node_id]]
            assert indexes[: last] == list(range(1, last + 1))
        finally:
            await cluster.stop_all()

    run(main())


def test_flush_sync_rounds_run_in_place_and_acks_still_follow_their_fsync(
        tmp_path: Path) -> None:
    """flush=sync with one small proposal at a time: followers and the
    leader fsync in the pass that wrote, without the driver or the fsync
    thread; every acknowledgement still leaves after the fsync that
    covered it. An entry over 32 KiB goes to the fsync thread, and is
    acknowledged once a majority fsynced it, the leader or not."""
    async def main() -> None:
        cluster = Cluster(tmp_path, flush="sync")
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            await cluster.wait_converged()
            before = {n: node.status().fsyncs_in_place for n, node in cluster.nodes.items()}
            for i in range(40):
                entry = await leader.propose(commitlog.KIND_MESSAGES, b"small-%d" % i)
                assert leader.status().durable_index >= entry.index
            await cluster.wait_converged()
            # The leader and its quick follower sync each entry; the reserve
            # (RaftNode rule 8) gets them in batches, also synced in place.
            gained = sorted(node.status().fsyncs_in_place - before[n]
                            for n, node in cluster.nodes.items())
            assert gained[0] >= 1 and gained[1] >= 30, gained
            for node in cluster.nodes.values():
                assert node.status().counters.acks_not_durable == 0
            in_place, rounds = leader.status().fsyncs_in_place, leader.status().fsyncs
            entry = await leader.propose(commitlog.KIND_MESSAGES, b"x" * 100_000)
            # The leader's own fsync runs on the thread and may end after
            # the two followers' acks committed the entry (the leader counts
            # itself only up to its fsync): at the ack, a majority has it.
            durable = [n for n, node in cluster.nodes.items()
                       if node.status().durable_index >= entry.index]
            assert len(durable) >= 2, durable
            await wait_until(lambda: leader.status().durable_index >= entry.index, 10,
                             "the leader's fsync of the large entry")
            status = leader.status()
            assert status.fsyncs > rounds and status.fsyncs_in_place == in_place
        finally:
            await cluster.stop_all()

    run(main())


def test_the_rest_of_an_apply_runs_after_the_answers_and_before_the_next_apply(
        tmp_path: Path) -> None:
    """What `apply` returns (the broker: its ConsumeQueue writes) runs once
    the pass that applied has told its proposals' callers (the broker's
    answers leave first), and always before the next apply: on the leader,
    in the pass of each commit; on a follower, with each batch it applies."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        events: dict[int, list[tuple[str, int]]] = {n: [] for n in cluster.peers}

        def apply_rest(node_id: int, entries: Sequence[commitlog.Entry]) -> Callable[[], None]:
            last = entries[-1].index
            events[node_id].append(("apply", last))
            return lambda: events[node_id].append(("rest", last))

        cluster.apply_rest = apply_rest
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            lid = leader.config.node_id
            told: list[int] = []

            def then(entry: commitlog.Entry | None, error: BaseException | None) -> None:
                assert entry is not None and error is None
                told.append(entry.index)
                # Told after its apply and before that apply's rest.
                assert events[lid][-1] == ("apply", entry.index)
                events[lid].append(("told", entry.index))

            for k in range(20):
                leader.propose_then(commitlog.KIND_MESSAGES, b"m-%d" % k, then)
                await wait_until(lambda k=k: len(told) == k + 1, 10.0, "the proposal told")
            await cluster.wait_converged()
            await wait_until(lambda: all(
                evs and evs[-1][0] == "rest" and evs[-1][1] >= told[-1]
                for evs in events.values()), 10.0, "every node ran the last rest")
            for node_id, evs in events.items():
                kinds = [kind for kind, _ in evs if kind != "told"]
                # apply, rest, apply, rest, ...: no apply before the last one's rest.
                assert kinds == ["apply", "rest"] * (len(kinds) // 2), node_id
                pairs = [i for kind, i in evs if kind != "told"]
                assert pairs[0::2] == pairs[1::2], node_id
            for index in told:
                at = events[lid].index(("told", index))
                assert events[lid][at - 1] == ("apply", index)
                assert events[lid][at + 1] == ("rest", index)
        finally:
            await cluster.stop_all()

    run(main())


def test_a_rest_that_fails_fails_the_node_and_nothing_is_applied_after_it(
        tmp_path: Path) -> None:
    """An error in the rest (the broker: a ConsumeQueue write on a full disk)
    is an error of the apply: the node fails, and no later entry reaches the
    state machine ahead of the queues it could not write."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        applied_after: list[int] = []
        broken: dict[int, int] = {}

        def apply_rest(node_id: int, entries: Sequence[commitlog.Entry]) -> Callable[[], None]:
            if node_id in broken:
                applied_after.extend(e.index for e in entries)

            def rest() -> None:
                if node_id == leader_id[0] and not broken and entries[-1].index >= 5:
                    broken[node_id] = entries[-1].index
                    raise OSError(28, "No space left on device")
            return rest

        leader_id = [0]
        cluster.apply_rest = apply_rest
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            leader_id[0] = leader.config.node_id
            for k in range(10):
                try:
                    await leader.propose(commitlog.KIND_MESSAGES, b"m-%d" % k)
                except (NotLeaderError, ProposalUnknown):
                    break
            await wait_until(lambda: leader.failed is not None, 10.0, "the leader failed")
            assert isinstance(leader.failed, OSError)
            assert applied_after == []
        finally:
            await cluster.stop_all()

    run(main())
