"""Fuzz runs against real processes: a NameServer and a 3-node broker group on
loopback (bench/fuzz.py's `start_cluster`, every admin app on), stopped by PID.

The CI budget is small (about 10 s of cases); longer runs are
`bench/fuzz.py --seconds N` (docs/fuzzing.md). The oracle is shown to bite:
a message it was told was acknowledged but is not stored, and a killed
broker, each fail the verdict.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.fuzz import campaign
from chaos.fuzz.cases import GENERATORS, RAFT, Case
from chaos.fuzz.oracle import AckLedger, Targets, verify
from ledgermq.base import loop
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.broker.launcher import LocalCluster
from ledgermq.wire import RpcClient

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

CI_SECONDS = 10.0
REPO = Path(__file__).resolve().parents[3]


def _bench_fuzz():
    """bench/fuzz.py, loaded by path: `bench` as a module name is tests/bench here."""
    spec = importlib.util.spec_from_file_location("bench_fuzz", REPO / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench_fuzz()
TOKEN = BENCH.TOKEN


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Targets]]:
    running, targets = BENCH.start_cluster(tmp_path_factory.mktemp("fuzz") / "cluster")
    try:
        yield running, targets
    finally:
        running.stop()


def test_a_short_run_passes_and_logs_every_case(cluster, tmp_path: Path) -> None:
    _, targets = cluster
    result = loop.run(campaign.run(targets, tmp_path, campaign.Budget(seconds=CI_SECONDS),
                                   seed=14, admin_token=TOKEN))
    assert result.passed, json.dumps(result.summary(), indent=1)[:4000]
    lines = [json.loads(x) for x in (tmp_path / campaign.SEEDS_FILE).read_text().splitlines()]
    assert lines[0]["run_seed"] == 14 and "summary" in lines[-1]
    cases = [x for x in lines if "case" in x]
    assert len(cases) == result.cases and {x["case"] for x in cases} == set(range(result.cases))
    every = {f"{kind}/{name}" for kind, gens in GENERATORS.items() for name in gens}
    assert set(result.by_generator) == every, every - set(result.by_generator)
    # Every port was hit, and acknowledged messages kept coming in meanwhile.
    assert {x["target"] for x in cases} == {p[0] for p in campaign.endpoints(targets)}
    assert result.acked > 50


async def _terms(targets: Targets) -> dict[int, int]:
    out = {}
    for nid, address in targets.brokers.items():
        host, port = split_host_port(address)
        client = await RpcClient.connect(host, port, role="admin")
        try:
            out[nid] = (await client.request(RequestCode.BROKER_STATUS, None))["term"]
        finally:
            await client.close()
    return out


def test_term_2_64_minus_1_no_longer_wedges_the_group(cluster) -> None:
    """Regression (found by the `wedge_term` generator, seed 3): before
    runtime_codec checked ranges, one such heartbeat left every node at term
    2**64 - 1, failing on its next election, with no leader ever again."""
    _, targets = cluster
    cases = [Case(n, f"broker-{nid}/raft", RAFT, "wedge_term", 1000 + n, nid)
             for n, nid in enumerate([1, 2, 3] * 5)]

    async def go() -> list[str]:
        ledger = AckLedger(targets.namesrv, campaign.ORACLE_TOPIC)
        await ledger.start()
        try:
            await ledger.send_many("before", 5)
            done = await campaign.replay(targets, cases)
            problems = [f for _, outcome in done for f in outcome.findings]
            problems += await verify(targets, ledger, timeout=20)
            if not problems:
                terms = await _terms(targets)
                problems += [f"node {n} at term {t}" for n, t in terms.items() if t >= 2**63]
        finally:
            await ledger.close()
        return problems

    assert loop.run(go()) == []


def test_the_oracle_notices_an_acknowledged_message_that_is_not_stored(cluster) -> None:
    _, targets = cluster

    async def go() -> list[str]:
        ledger = AckLedger(targets.namesrv, campaign.ORACLE_TOPIC)
        await ledger.start()
        try:
            await ledger.send_many("before", 3)
            key = next(iter(ledger.acked))
            ledger.acked[key] = b"not what was stored"
            ledger.acked[(0, 10**9)] = b"never sent"
            return await verify(targets, ledger, timeout=20)
        finally:
            await ledger.close()

    problems = loop.run(go())
    assert len(problems) == 3, problems  # once per node
    assert all("2 of" in p and "missing or changed" in p for p in problems), problems


def test_the_oracle_notices_a_dead_broker(cluster) -> None:
    running, targets = cluster
    running.kill(3)
    try:
        async def go() -> list[str]:
            ledger = AckLedger(targets.namesrv, campaign.ORACLE_TOPIC)
            await ledger.start()
            try:
                return await verify(targets, ledger, timeout=3)
            finally:
                await ledger.close()

        problems = loop.run(go())
    finally:
        running.start_node(3)
    assert "process broker-3 is not running" in problems
    assert any(p.startswith("raft ") and "refused" in p.lower() for p in problems), problems
