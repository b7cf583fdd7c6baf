"""/metrics of a running 3-node group: the figures move as messages flow and
as the leader changes (scraped over HTTP, parsed with prometheus-client)."""

from __future__ import annotations

import pytest
from ops.support import TOKEN, OpsCluster, http, until
from prometheus_client.parser import text_string_to_metric_families

from ledgermq.base import loop
from ledgermq.broker.launcher import wait_leader
from ledgermq.client import Producer, PullConsumer
from ledgermq.client.model import MessageQueue

pytestmark = [pytest.mark.timeout(120)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> Samples:
    status, text = await http("GET", f"{url}/metrics")
    assert status == 200, text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_figures_move_with_traffic_and_leader_change(ops_cluster: OpsCluster) -> None:
    ns = ops_cluster.namesrv_url

    async def main() -> None:
        leader = await wait_leader(ops_cluster)
        urls = {nid: await ops_cluster.admin_url(nid) for nid in ops_cluster.alive()}
        status, _ = await http("POST", f"{ns}/api/v1/topics", {"topic": "Metered", "queues": 2},
                               token=TOKEN)
        assert status == 201
        before = {nid: await scrape(url) for nid, url in urls.items()}
        lead = before[leader]
        assert value(lead, "ledgermq_raft_role", role="leader") == 1
        assert value(lead, "ledgermq_raft_leader_ready") == 1
        for nid, samples in before.items():
            assert value(samples, "ledgermq_raft_role",
                         role="leader" if nid == leader else "follower") == 1
        assert {dict(ls)["follower"] for (n, ls) in lead
                if n == "ledgermq_raft_follower_match_index"} == \
            {str(n) for n in urls if n != leader}
        # Three nodes: one quick follower, one reserve (RaftNode rule 8).
        assert sorted(v for (n, _), v in lead.items()
                      if n == "ledgermq_raft_follower_reserve") == [0.0, 1.0]

        count = 300
        async with Producer([ops_cluster.namesrv_address]) as producer:
            for _ in range(0, count, 50):
                await producer.send_batch("Metered", [b"x" * 100] * 50)
        after_leader = await until(
            lambda: _scraped_with(urls[leader], "ledgermq_messages_in_total", count,
                                  topic="Metered"),
            10, "messages_in on the leader")
        # Record bytes: the 100-byte body plus the record's head and topic name.
        assert value(after_leader, "ledgermq_bytes_in_total", topic="Metered") > count * 100
        assert value(after_leader, "ledgermq_raft_commit_index") > \
            value(lead, "ledgermq_raft_commit_index")
        assert value(after_leader, "ledgermq_raft_commit_seconds_count") > \
            value(lead, "ledgermq_raft_commit_seconds_count")
        assert value(after_leader, "ledgermq_group_commit_batch_messages_sum") >= count
        assert value(after_leader, "ledgermq_requests_total", request="send_messages") >= 6
        assert value(after_leader, "ledgermq_raft_proposals_total") > \
            value(lead, "ledgermq_raft_proposals_total")
        # The reserve gets the entries in batches: at the leader's next tick
        # at the latest (the sends may all end within one tick).
        await until(lambda: _rose(urls[leader], lead, "ledgermq_raft_reserve_appends_total"),
                    10, "a batch sent to the reserve")
        # Followers store the same messages; their appends and fsyncs are timed.
        for nid in urls:
            samples = await until(
                lambda n=nid: _scraped_with(urls[n], "ledgermq_topic_messages_stored_total",
                                            count, topic="Metered"),
                10, f"messages stored on n{nid}")
            assert value(samples, "ledgermq_commitlog_append_seconds_count") > \
                value(before[nid], "ledgermq_commitlog_append_seconds_count")
            await until(lambda n=nid: _scraped_above(
                urls[n], "ledgermq_commitlog_fsync_seconds_count",
                value(before[n], "ledgermq_commitlog_fsync_seconds_count")),
                10, f"an fsync on n{nid}")
            # An fsync round runs in place (a follower's, a leader's small
            # entries) or passes to the fsync thread and back, timed.
            await until(lambda n=nid: _fsynced_either_way(urls[n], before[n]),
                        10, f"an fsync in place or its hand-off time on n{nid}")
        # Pulls count messages out; a committed offset shows up as lag per queue.
        consumer = PullConsumer([ops_cluster.namesrv_address], "metered-cg")
        try:
            mq = MessageQueue("Metered", "broker-a", 0)
            result = await consumer.pull(mq, 0, max_messages=64)
            pulled = len(result.messages)
            assert pulled > 0
            await consumer.commit(mq, pulled)
        finally:
            await consumer.close()
        hi = value(after_leader, "ledgermq_queue_max_offset", topic="Metered", queue="0")
        samples = await until(lambda: _scraped_with(
            urls[leader], "ledgermq_consumer_group_lag_messages", hi - pulled,
            consumer_group="metered-cg", topic="Metered", queue="0"), 10, "group lag")
        total_out = 0.0
        for url in urls.values():
            total_out += value(await scrape(url), "ledgermq_messages_out_total", topic="Metered")
        assert total_out >= pulled
        assert value(samples, "ledgermq_consumer_group_offset", consumer_group="metered-cg",
                     queue="0") == pulled
        # An error is counted by code.
        async with Producer([ops_cluster.namesrv_address]) as producer:
            with pytest.raises(Exception):  # noqa: B017 - the wire error type is not the point
                await producer.send("Metered", b"x", queue=MessageQueue("Metered",
                                                                        "broker-a", 7))
        errors = await scrape(urls[leader])
        assert value(errors, "ledgermq_request_errors_total", code="INVALID_REQUEST") >= 1

        # Kill the leader: a survivor leads at a higher term; both count the change.
        term = value(await scrape(urls[leader]), "ledgermq_raft_term")
        survivors = [n for n in urls if n != leader]
        changes = {n: value(await scrape(urls[n]), "ledgermq_raft_leader_changes_total")
                   for n in survivors}
        ops_cluster.kill(leader)
        new_leader = await wait_leader(ops_cluster, exclude=(leader,))

        async def moved():
            out = {n: await scrape(urls[n]) for n in survivors}
            ok = all(value(s, "ledgermq_raft_term") > term
                     and value(s, "ledgermq_raft_leader_changes_total") > changes[n]
                     and value(s, "ledgermq_raft_leader_id") == new_leader
                     for n, s in out.items())
            return out if ok else None

        out = await until(moved, 15, "the survivors' figures to follow the new leader")
        assert value(out[new_leader], "ledgermq_raft_role", role="leader") == 1
        assert sum(value(s, "ledgermq_raft_elections_total") for s in out.values()) >= 1
        # The NameServer's own metrics show the group's new leader term.
        ns_samples = await until(lambda: _scraped_above(
            ns, "ledgermq_namesrv_group_leader_term", term, group="broker-a"), 15,
            "the NameServer to route to the new leader")
        assert value(ns_samples, "ledgermq_namesrv_requests_total",
                     request="register_broker") > 0
        ops_cluster.start_node(leader)  # leave a full group for later tests

    loop.run(main())


async def _scraped_with(url: str, name: str, expected: float, **labels: str) -> Samples | None:
    samples = await scrape(url)
    return samples if value(samples, name, **labels) == expected else None


async def _rose(url: str, before: Samples, name: str) -> bool:
    return value(await scrape(url), name) > value(before, name)


async def _fsynced_either_way(url: str, before: Samples) -> bool:
    samples = await scrape(url)
    return any(value(samples, name) > value(before, name)
               for name in ("ledgermq_commitlog_fsyncs_in_place_total",
                            "ledgermq_commitlog_fsync_handoff_seconds_total"))


async def _scraped_above(url: str, name: str, floor: float, **labels: str) -> Samples | None:
    samples = await scrape(url)
    return samples if value(samples, name, **labels) > floor else None
