"""Three nights of ``ledgermq audit --nightly`` over a real three-node group that keeps
producing between nights, with retention deleting segments between them.

A NameServer and three brokers run as processes on 127.0.0.1 (``OpsCluster``),
64 KiB segments, snapshots every 40 entries, retention only on an operator's
trim. Night 1 audits 1..C1; night 2 audits C1+1..C2 while a producer keeps
writing past the cut, and re-verifies a sample of night 1; then the operator
trims the log (``ledgermq retention trim``) and every replica deletes its
oldest segments: night 3 lists the deleted ranges as dropped, reports no
violation, and audits what is new. Then, on the stopped replicas: a message
body rewritten consistently on every replica, with every CRC recomputed (the
entry's, the Raft-index record's), inside a range already verified, passes
every other check and is caught by the digest on the night that re-verifies
it; a damaged manifest is refused. After every night, every retained index
was verified within the last N nights (the rotation's promise).
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from ops.support import TOKEN, OpsCluster, until
from typer.testing import CliRunner

from ledgermq.base import audit_night, loop
from ledgermq.broker.launcher import node_status, wait_leader
from ledgermq.cli import app
from ledgermq.client import Producer
from ledgermq.client.admin import AdminApi
from ledgermq.wire.auth import write_secret_file
from spark_audit import fmt, manifest, planted

pytestmark = [pytest.mark.timeout(240)]

SEGMENT = 64 * 1024
SETTINGS = {"segment_size_bytes": SEGMENT, "retention_bytes": 1 << 40,
            "retention_interval_ms": 200, "snapshot_interval_entries": 40,
            # Whatever this machine's disk holds, only the operator's trim deletes.
            "disk_soft_ratio": 1.0, "disk_hard_ratio": 1.0}
NIGHTS = 3  # --rolling-nights
BODY = b"." * 900


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


class Nights:
    """The state directory and the nights run so far."""

    def __init__(self, cluster: OpsCluster, state: Path) -> None:
        self.spec = f"{cluster.group}=" + ",".join(str(cluster.base / f"n{n}")
                                                   for n in sorted(cluster.peers))
        self.group = cluster.group
        self.state = state
        self.docs: list[dict[str, Any]] = []
        # The manifests are sealed with a key kept apart from the state directory.
        self.key_file = state.parent / "manifest.key"
        self.key = write_secret_file(self.key_file)

    async def run(self, cut: int | None = None) -> tuple[int, str, dict[str, Any]]:
        args = ["audit", "--nightly", "--state", str(self.state), "--engine", "python",
                "--rolling-nights", str(NIGHTS), "--digest-block", "64",
                "--manifest-key-file", str(self.key_file), self.spec]
        if cut:
            args += ["--cut", f"{self.group}={cut}"]
        code, out = await asyncio.to_thread(run_cli, *args)
        doc = json.loads((self.state / "latest.json").read_text())
        # What the report and the NameServer will read of it, they believe.
        assert audit_night.read_latest(self.state).doc == doc
        assert (self.state / "index.html").is_file() and (self.state / "audit.prom").is_file()
        self.docs.append(doc)
        return code, out, doc

    def manifest(self) -> manifest.Manifest:
        m = manifest.load(str(self.state), self.group, self.key)
        assert m is not None
        return m

    def assert_rotation(self) -> None:
        """Every retained span was verified within the last NIGHTS nights."""
        m = self.manifest()
        assert m.spans and min(s.night_no for s in m.spans) > m.nights - NIGHTS, [
            (s.lo, s.hi, s.night_no) for s in m.spans]
        # The spans cover the retained, verified log without a hole.
        assert all(a.hi + 1 == b.lo for a, b in zip(m.spans, m.spans[1:], strict=False))
        assert m.spans[-1].hi == m.verified_through


async def produce(ns: str, n: int, start: int) -> None:
    async with Producer([ns], retry_timeout=20.0) as producer:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                await producer.send("N", b"%06d" % i + BODY)

        await asyncio.gather(*(one(i) for i in range(start, start + n)))


async def settled(cluster: OpsCluster) -> int:
    """Until every replica applied the same last entry and every hardstate file on disk
    records it committed; that commit index (the cut the live audit will capture)."""
    async def same() -> int | None:
        statuses = [await node_status(cluster.client_address(n)) for n in cluster.peers]
        if any(s is None for s in statuses):
            return None
        last = {s["last_index"] for s in statuses if s}
        applied = {s["applied_index"] for s in statuses if s}
        commit = {s["commit_index"] for s in statuses if s}
        return commit.pop() if len(last) == len(applied) == len(commit) == 1 else None

    cut = await until(same, 30, "the replicas to settle")

    async def persisted() -> bool:
        return all(hardstate_commit(cluster.base / f"n{n}") >= cut for n in cluster.peers)

    await until(persisted, 15, "every hardstate to record the commit")
    return int(cut)


def hardstate_commit(node: Path) -> int:
    try:
        return fmt.parse_hardstate((node / "hardstate").read_bytes()).commit
    except (OSError, fmt.FormatError):
        return 0


def test_three_nights_with_production_and_retention(tmp_path: Path) -> None:
    cluster = OpsCluster(tmp_path / "cluster")
    cluster.settings.update(SETTINGS)
    cluster.start()
    nights = Nights(cluster, tmp_path / "state")
    try:
        loop.run(live_nights(cluster, nights))
    finally:
        cluster.stop()
    stopped_nights(cluster, nights)


async def live_nights(cluster: OpsCluster, nights: Nights) -> None:
    await wait_leader(cluster)
    ns = cluster.namesrv_address
    async with Producer([ns], retry_timeout=20.0) as producer:
        await producer.create_topic("N", queues=2)
    await produce(ns, 240, 0)
    c1 = await settled(cluster)

    # Night 1: everything up to the cut is new.
    code, out, doc = await nights.run(c1)
    g = doc["groups"][cluster.group]
    assert code == 0 and doc["valid"], out
    assert g["new"] == [1, c1] and g["reverified"] == [] and g["dropped"] == []
    assert g["cut"] == c1 and g["cut_source"] == "admin" and g["verified_through"] == c1
    assert f"audit night {doc['night']} PASSED: 1 group" in out and f"new 1..{c1}" in out
    nights.assert_rotation()

    # Night 2, audited while a producer writes past the cut: C1+1..C2 new, a sample of
    # night 1 re-verified, nothing past the cut read or judged.
    await produce(ns, 200, 240)
    c2 = await settled(cluster)
    busy = asyncio.ensure_future(produce(ns, 300, 440))
    try:
        code, out, doc = await nights.run(c2)
    finally:
        await busy
    g = doc["groups"][cluster.group]
    assert code == 0 and doc["valid"] and g["findings"] == {}, out
    assert g["new"] == [c1 + 1, c2] and g["verified_through"] == c2
    assert g["reverified"] and all(1 <= a <= b <= c1 for a, b in g["reverified"])
    assert sum(b - a + 1 for a, b in g["reverified"]) >= c1 / NIGHTS
    nights.assert_rotation()
    # The run read nothing past the cut although the brokers had written it.
    run = json.loads((nights.state / "nights" / doc["night"] / "runs" / "new" /
                      "summary.json").read_text())
    assert all(r["last_index"] <= c2 for r in run["replicas"])
    assert max(s["last_index"] for s in [await node_status(cluster.client_address(n))
                                         for n in cluster.peers] if s) > c2

    # Retention: the operator trims up to night 1's cut; each replica deletes the
    # segments below once its next snapshot covers them.
    await settled(cluster)
    async with AdminApi(cluster.namesrv_url) as api:
        code_, out_ = await asyncio.to_thread(
            run_cli, "retention", "trim", "--index", str(c1), "--token", TOKEN, "-o", "json",
            "--admin", cluster.namesrv_url)
        assert code_ == 0, out_
        point = json.loads(out_)["position"]
        await produce(ns, 120, 740)

        async def trimmed() -> list[dict[str, Any]] | None:
            answer = await api.call("GET", "retention")
            nodes = [n for grp in answer["groups"].values() for n in grp["nodes"]]
            ok = len(nodes) == 3 and all("error" not in n and n["retained"]["first_position"]
                                         == point for n in nodes)
            return nodes if ok else None

        nodes = await until(trimmed, 60, "every replica to delete up to the trim point")
    floor = min(n["retained"]["first_index"] for n in nodes)
    assert floor > 1
    c3 = await settled(cluster)

    # Night 3: retention's deletions are dropped from the manifest, not lost.
    code, out, doc = await nights.run(c3)
    g = doc["groups"][cluster.group]
    assert code == 0 and doc["valid"] and g["violations"] == 0, out
    assert g["new"] == [c2 + 1, c3]
    assert g["dropped"] and g["dropped"][0][0] == 1 and g["dropped"][-1][1] == floor - 1
    assert f"dropped 1..{floor - 1}" in out
    m = nights.manifest()
    assert m.spans[0].lo == floor and m.verified_through == c3
    nights.assert_rotation()


def rewrite_everywhere(g: Path, index: int) -> None:
    """A message body rewritten on every replica, with every CRC recomputed: the
    entry's body and header CRC, and the Raft-index record's copy and CRC."""
    for node in sorted(g.iterdir()):
        if not (node / "commitlog").is_dir():
            continue
        e = planted.entry(node, index)
        body = planted.rewritten_body(e)
        planted.rewrite(e, body=body)
        ix = max((p for p in (node / "index").iterdir() if int(p.name) <= index),
                 key=lambda p: int(p.name))
        slot = index - int(ix.name)
        raw = bytearray(planted.read_at(ix, slot * 32, 28))
        raw[24:28] = struct.pack("<I", fmt.crc(body))
        planted.write_at(ix, slot * 32, bytes(raw) + struct.pack("<I", fmt.crc(bytes(raw))))


def stopped_nights(cluster: OpsCluster, nights: Nights) -> None:
    g = cluster.base
    m = nights.manifest()
    # A MESSAGES entry inside a span verified the night before last, still retained.
    target = next(e for e in planted.message_entries(g / "n1")
                  if m.spans[1].lo <= e.index <= m.spans[1].hi)
    span = next(s for s in m.spans if s.lo <= target.index <= s.hi)
    rewrite_everywhere(g, target.index)
    # The plain audit of the whole log finds nothing: the replicas agree.
    code, out = run_cli("audit", "--engine", "python", "--out", str(g / "plain"), nights.spec)
    assert code == 0, out

    caught = None
    for _ in range(NIGHTS):
        code, out, doc = loop.run(nights.run())
        grp = doc["groups"][cluster.group]
        covered = any(a <= span.lo and span.hi <= b for a, b in grp["reverified"])
        if not covered:
            assert code == 0 and doc["valid"], out
            nights.assert_rotation()
            continue
        assert code == 1 and not doc["valid"], out
        assert grp["findings"] == {"digest_mismatch": 3} and doc["violations"] == 3
        assert "FAILED: 3 violations (digest_mismatch 3)" in out
        found = json.loads((nights.state / "nights" / doc["night"] / "digests.json")
                           .read_text())
        assert sorted(x["replica"] for x in found) == ["n1", "n2", "n3"]
        assert all(x["group"] == cluster.group and x["range"] == [span.lo, span.hi]
                   for x in found)
        caught = doc["night"]
        break
    assert caught is not None, "the rewritten span was not re-verified within N nights"
    # A failed night leaves the manifest as it was: the next one reports it again.
    before = nights.manifest()
    code, out, doc = loop.run(nights.run())
    assert nights.manifest() == before
    assert code == 1 or not any(a <= span.lo and span.hi <= b for a, b in
                                doc["groups"][cluster.group]["reverified"])

    # A manifest edited by hand (its seal not recomputed) is refused, naming the file,
    # and so is a damaged one; the night exits 2 and changes nothing.
    path = Path(manifest.path_of(str(nights.state), cluster.group))
    raw = path.read_bytes()
    edited = json.loads(raw)
    edited["verified_through"] += 1000
    path.write_text(json.dumps(edited))
    code, out, doc = loop.run(nights.run())
    assert code == 2 and doc["exit"] == 2 and not doc["valid"] and doc["groups"] == {}, out
    assert "ERROR" in out and str(path) in out and "sha256" in out
    path.write_bytes(raw[:len(raw) // 2])
    code, out, doc = loop.run(nights.run())
    assert code == 2 and str(path) in out and "not valid JSON" in out, out
    path.write_bytes(raw)
    assert nights.manifest() == before
