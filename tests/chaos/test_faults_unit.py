"""Nemesis parsing and targeting, and the file faults, without any cluster."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos import disk_faults
from chaos.nemesis import REGISTRY, Context, MajoritiesRing, needs, parse


class RecordingBackend:
    """Records drop rules; enough of a Backend for the partition nemeses."""

    def __init__(self, nodes: int) -> None:
        self.node_ids = list(range(1, nodes + 1))
        self.dropped: set[tuple[int, int]] = set()

    def drop(self, src: int, dst: int, probability: float = 1.0) -> None:
        self.dropped.add((src, dst))

    def heal(self) -> None:
        self.dropped.clear()


def test_parse_names_and_parameters() -> None:
    nemeses = parse("kill-leader,loss:probability=0.5,power-loss:targets=all+torn_tail=64")
    assert [n.name for n in nemeses] == ["kill-leader", "loss", "power-loss"]
    assert nemeses[1].params == {"probability": "0.5"}
    assert nemeses[2].params == {"targets": "all", "torn_tail": "64"}
    assert needs(nemeses) == {"kill", "loss", "power-loss"}
    with pytest.raises(ValueError, match="unknown nemesis"):
        parse("meteor")
    assert all(cls.doc and cls.needs for cls in REGISTRY.values())


@pytest.mark.parametrize("nodes", [3, 5])
def test_majorities_ring_gives_every_node_a_different_majority(nodes: int) -> None:
    backend = RecordingBackend(nodes)
    ctx = Context(backend, random.Random(nodes), leader=lambda: None)  # type: ignore[arg-type]
    MajoritiesRing().start(ctx)
    seen = {n: frozenset({n} | {m for m in backend.node_ids
                               if m != n and (n, m) not in backend.dropped})
            for n in backend.node_ids}
    assert all(len(view) >= nodes // 2 + 1 for view in seen.values())
    assert len(set(seen.values())) > 1  # not everyone sees the same majority
    assert backend.dropped  # something is cut


def test_power_cut_keeps_exactly_the_traced_lengths(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    seg = tmp_path / "commitlog" / ("0" * 20)
    seg.write_bytes(b"a" * 1000)
    (tmp_path / "commitlog" / (seg.name + ".durable")).write_text("600\n")
    unsynced = tmp_path / "hardstate.tmp"
    unsynced.write_bytes(b"x" * 40)
    (tmp_path / "LOCK").write_bytes(b"")
    report = disk_faults.power_cut(tmp_path, torn_tail=16, rng=random.Random(1))
    assert seg.stat().st_size == 616 and seg.read_bytes()[:600] == b"a" * 600
    assert not unsynced.exists() and (tmp_path / "LOCK").exists()
    assert report.bytes_dropped == 400 + 40 and report.torn_bytes == 16
    assert (tmp_path / "commitlog" / (seg.name + ".durable")).exists()


def test_truncate_and_bitflip(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    seg = tmp_path / "commitlog" / ("0" * 20)
    seg.write_bytes(bytes(256))
    assert disk_faults.segment_files(tmp_path) == [seg]
    assert disk_faults.truncate_tail(seg, 56) == 56 and seg.stat().st_size == 200
    offsets = disk_faults.flip_bits(seg, 3, random.Random(2))
    data = seg.read_bytes()
    assert len(offsets) == 3 and all(data[o] != 0 for o in offsets)
    assert sum(bin(b).count("1") for b in data) <= 3
