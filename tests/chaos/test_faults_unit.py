"""Nemesis parsing and targeting, and the file faults, without any cluster."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from chaos import disk_faults
from chaos.backend import HarnessError
from chaos.history import History
from chaos.nemesis import REGISTRY, Bitflip, Context, MajoritiesRing, Nemesis, needs, parse
from chaos.runner import RunConfig
from chaos.schedule import Schedule, run_schedule


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


class DiskBackend(RecordingBackend):
    """Node data directories under `root`; signals recorded (nothing runs)."""

    def __init__(self, nodes: int, root: Path) -> None:
        super().__init__(nodes)
        self.root = root
        self.signals: list[tuple[int, int]] = []

    def signal_node(self, node: int, sig: int) -> None:
        self.signals.append((node, sig))

    def wait_node_exit(self, node: int, timeout: float) -> bool:
        return True

    def data_dir(self, node: int) -> Path:
        return self.root / f"n{node}"


def test_a_torn_trace_stops_the_schedule_with_a_harness_error(tmp_path: Path) -> None:
    """The power-loss nemesis must not carry on past a trace it cannot read: the
    schedule re-raises, so the run stops (and is not valid) instead of logging it."""
    backend = DiskBackend(1, tmp_path)
    seg = backend.data_dir(1) / "commitlog" / ("0" * 20)
    seg.parent.mkdir(parents=True)
    seg.write_bytes(b"s" * 5000)
    (seg.parent / (seg.name + ".durable")).write_bytes(b"")  # torn
    ctx = Context(backend, random.Random(3), leader=lambda: None,  # type: ignore[arg-type]
                  log=lambda _m: None)
    history = History(tmp_path / "history.jsonl")
    with pytest.raises(HarnessError, match="torn or damaged"):
        asyncio.run(run_schedule(parse("power-loss:targets=all"), Schedule("fixed", 1, 0),
                                 ctx, history, 5.0, random.Random(3)))
    history.close()
    assert seg.stat().st_size == 5000
    errors = [op for op in history.ops if op.process == "nemesis" and op.error]
    assert errors and "HarnessError" in errors[0].error


def test_may_stay_down_is_explicit_and_checked() -> None:
    assert [n.may_stay_down for n in parse("kill,bitflip:may_stay_down=1,truncate:"
                                          "may_stay_down=0,power-loss:may_stay_down=true")] == \
        [False, True, False, True]
    with pytest.raises(ValueError, match="may_stay_down"):
        parse("kill-leader:may_stay_down=maybe")


def test_bitflip_can_damage_a_named_file_of_the_data_dir(tmp_path: Path) -> None:
    backend = DiskBackend(1, tmp_path)
    (backend.data_dir(1)).mkdir()
    hardstate = backend.data_dir(1) / "hardstate"
    hardstate.write_bytes(bytes(40))
    ctx = Context(backend, random.Random(4), leader=lambda: None,  # type: ignore[arg-type]
                  log=lambda _m: None)
    detail = Bitflip(file="hardstate", bits="3").start(ctx)
    assert detail["node"] == 1 and detail["file"] == "hardstate"
    assert backend.signals == [(1, signal.SIGKILL)]
    assert hardstate.read_bytes() != bytes(40)
    with pytest.raises(ValueError, match="inside the data dir"):
        Bitflip(file="../elsewhere")


@pytest.mark.parametrize("fields", [{"time_limit": -5}, {"time_limit": float("nan")},
                                    {"rate": 0}, {"producers": 0}, {"queues": 0},
                                    {"consumers": -1}, {"nodes": 4}])
def test_a_run_no_cluster_can_have_is_refused_before_it_starts(tmp_path, fields) -> None:
    """A negative --time-limit used to run, and pass, a run with no faults."""
    with pytest.raises(ValueError, match="must be"):
        RunConfig(out=tmp_path / "run", **fields)


@pytest.mark.parametrize(("on", "off"), [(0, 1), (-1, 1), (1, -1), (float("nan"), 1)])
def test_a_schedule_with_no_time_in_it_is_refused(on: float, off: float) -> None:
    with pytest.raises(ValueError, match="a fault period lasts"):
        Schedule("fixed", on, off)


class _Plan(Nemesis):
    """A plan of `steps` steps, one per period it is chosen in (as the
    membership plans carry out one change per period)."""

    name, needs, doc = "plan", (), "a plan of steps"

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.done = steps, 0

    def start(self, ctx: Context) -> dict[str, Any]:
        self.done += 1
        return {"step": self.done}

    def stop(self, ctx: Context) -> dict[str, Any]:
        return {}

    @property
    def finished(self) -> bool:
        return self.done >= self.steps

    @property
    def plan_unfinished(self) -> bool:
        return not self.finished


class _Fault(_Plan):
    name = "fault"

    def __init__(self) -> None:
        super().__init__(0)

    @property
    def finished(self) -> bool:
        return False

    @property
    def plan_unfinished(self) -> bool:
        return False


def _schedule(nemeses: list[Nemesis], tmp_path: Path, time_limit: float,
              seed: int = 7) -> list[str]:
    """Run the random schedule; what it logged."""
    said: list[str] = []
    ctx = Context(DiskBackend(1, tmp_path), random.Random(seed),  # type: ignore[arg-type]
                  leader=lambda: None, log=said.append)
    history = History(tmp_path / f"history-{seed}.jsonl")
    asyncio.run(run_schedule(nemeses, Schedule("random", 0.02, 0.02), ctx, history,
                             time_limit, random.Random(seed)))
    history.close()
    return said


def test_a_plan_unfinished_at_the_time_limit_gets_more_periods(tmp_path: Path) -> None:
    """A random schedule may pick a plan too rarely for its steps: at the time
    limit it runs on, the plan chosen every period, until the plan is done
    (the run's final check would call it invalid for a configuration the plan
    never got to make), and then stops; never past 3 times the limit."""
    plan, fault = _Plan(4), _Fault()
    said = _schedule([plan, fault], tmp_path, 0.1)
    assert plan.finished, plan.done
    assert any("unfinished: periods go on" in line for line in said), said
    assert said[-1] == "chaos: every plan is carried out", said
    # Only faults: the time limit is the time limit.
    said = _schedule([_Fault()], tmp_path, 0.1, seed=8)
    assert not any("unfinished" in line or "carried out" in line for line in said), said
    # A plan that cannot finish is cut at 3 times the limit (the final check
    # then reports it): the schedule returns, the plan unfinished.
    endless = _Plan(10**6)
    said = _schedule([endless], tmp_path, 0.1, seed=9)
    assert not endless.finished and endless.done > 0
    assert any("0.3 s in all at most" in line for line in said), said
    assert "chaos: every plan is carried out" not in said
