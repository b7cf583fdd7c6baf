"""The leader's retention policy (`broker.retention_policy.trim_point`) and the
retention configuration keys: pure functions, so every rule and every safety
limit is pinned here, and a property test checks the limits on random logs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgermq.broker.config import (
    BrokerConfig,
    BrokerConfigError,
    Peer,
    parse_config,
    render_config,
)
from ledgermq.broker.retention_policy import (
    HOUR_MS,
    DiskUsage,
    RetentionSettings,
    segment_floor,
    trim_point,
)

S = 1000  # segment size of the made-up logs
NOW = 10_000 * HOUR_MS


@dataclass(frozen=True)
class Seg:
    base: int
    length: int
    first_index: int
    mtime_ms: int


def log_of(*ages_h: float, length: int = S, first: int = 0) -> list[Seg]:
    """Full segments from position `first`, the i-th last written ages_h[i] hours ago."""
    return [Seg(first + i * S, length, 1 + i * 10, NOW - round(age * HOUR_MS))
            for i, age in enumerate(ages_h)]


AGE_ONLY = RetentionSettings(retention_ms=72 * HOUR_MS, retention_bytes=0)


def test_nothing_to_decide_on_an_empty_log() -> None:
    decision = trim_point([], 500, AGE_ONLY, NOW)
    assert (decision.position, decision.deletes, decision.reasons) == (0, False, ())


def test_age_drops_the_segments_last_written_before_the_cut() -> None:
    segments = log_of(100, 80, 73, 71, 1)
    decision = trim_point(segments, 5 * S, AGE_ONLY, NOW)
    assert decision.position == 3 * S  # segments 0-2 are older than 72 h
    assert decision.reasons == ("age",) and decision.deletes
    assert decision.blocked_by is None


def test_age_takes_only_the_oldest_run() -> None:
    # A segment written later below an old one (clocks) stops the age rule:
    # only a prefix ever goes.
    segments = log_of(100, 10, 100, 1)
    assert trim_point(segments, 4 * S, AGE_ONLY, NOW).position == S


def test_an_unknown_mtime_is_never_old() -> None:
    # A file system that keeps no modification times reports 0.
    segments = [Seg(0, S, 1, 0), *log_of(100, 1, first=S)]
    assert not trim_point(segments, 3 * S, AGE_ONLY, NOW).deletes


def test_age_zero_means_no_age_limit() -> None:
    segments = log_of(1000, 900, 1)
    decision = trim_point(segments, 3 * S, RetentionSettings(retention_ms=0), NOW)
    assert not decision.deletes and decision.reasons == ()


def test_young_segments_stay() -> None:
    decision = trim_point(log_of(5, 4, 3), 3 * S, AGE_ONLY, NOW)
    assert decision.position == 0 and not decision.deletes


def test_without_a_snapshot_nothing_may_go() -> None:
    decision = trim_point(log_of(100, 100, 100, 1), None, AGE_ONLY, NOW)
    assert decision.position == 0 and decision.wanted == 3 * S
    assert decision.blocked_by == "snapshot" and not decision.deletes


def test_the_segment_holding_entries_after_the_snapshot_stays() -> None:
    segments = log_of(100, 100, 100, 100, 1)
    # The snapshot ends inside segment 2: segments 0 and 1 may go, 2 holds
    # entries after the snapshot.
    decision = trim_point(segments, 2 * S + 10, AGE_ONLY, NOW)
    assert (decision.position, decision.limit, decision.blocked_by) == (2 * S, 2 * S,
                                                                         "snapshot")
    # Ending exactly at a segment's end: that segment is wholly covered.
    assert trim_point(segments, 3 * S, AGE_ONLY, NOW).position == 3 * S


def test_a_short_segment_covered_by_the_snapshot_may_go() -> None:
    # Entries never straddle segments, so a segment can end early; the
    # snapshot ending where its bytes end covers it wholly.
    segments = [Seg(0, 700, 1, 1), Seg(S, 900, 8, 1), Seg(2 * S, 100, 15, NOW)]
    assert trim_point(segments, 700, AGE_ONLY, NOW).position == S
    assert trim_point(segments, 699, AGE_ONLY, NOW).position == 0


def test_the_last_segment_always_stays() -> None:
    segments = log_of(100, 100, 100)
    decision = trim_point(segments, 10 * S, AGE_ONLY, NOW)
    assert decision.position == 2 * S and decision.blocked_by == "last_segment"
    one = log_of(100)
    assert trim_point(one, 10 * S, AGE_ONLY, NOW).position == 0


def test_size_keeps_at_most_retention_bytes_of_segments() -> None:
    segments = log_of(1, 1, 1, 1, 1)  # 5000 bytes, all young
    by_size = RetentionSettings(retention_ms=0, retention_bytes=2500)
    decision = trim_point(segments, 5 * S, by_size, NOW)
    assert decision.position == 3 * S and decision.reasons == ("size",)
    exact = RetentionSettings(retention_ms=0, retention_bytes=3000)
    assert trim_point(segments, 5 * S, exact, NOW).position == 2 * S
    assert not trim_point(segments, 5 * S, RetentionSettings(retention_ms=0,
                                                             retention_bytes=5000), NOW).deletes


def test_size_counts_what_segments_hold_not_their_capacity() -> None:
    segments = [Seg(0, 400, 1, NOW), Seg(S, 400, 5, NOW), Seg(2 * S, 400, 9, NOW)]
    settings_ = RetentionSettings(retention_ms=0, retention_bytes=800)
    assert trim_point(segments, 3 * S, settings_, NOW).position == S


def test_the_size_rule_leaves_the_headroom_free_below_the_limit() -> None:
    """retention_bytes is a ceiling: the cut leaves room for what the log
    will take before the next pass (the caller's measured growth)."""
    segments = log_of(1, 1, 1, 1, 1)  # 5000 bytes
    by_size = RetentionSettings(retention_ms=0, retention_bytes=4000)
    assert trim_point(segments, 5 * S, by_size, NOW).position == S
    decision = trim_point(segments, 5 * S, by_size, NOW, headroom_bytes=1500)
    # At most 2500 may stay: whole segments, so 2000.
    assert decision.position == 3 * S and decision.reasons == ("size",)
    assert decision.headroom == 1500 and decision.to_json()["headroom"] == 1500
    # A headroom of a whole segment moves the cut by exactly one segment.
    assert trim_point(segments, 5 * S, by_size, NOW, headroom_bytes=S).position == 2 * S


def test_the_headroom_takes_at_most_half_the_limit() -> None:
    """A log growing faster than half its limit between passes keeps half
    the limit after a cut (and overshoots), rather than nothing."""
    segments = log_of(1, 1, 1, 1, 1, 1)  # 6000 bytes
    by_size = RetentionSettings(retention_ms=0, retention_bytes=4000)
    decision = trim_point(segments, 6 * S, by_size, NOW, headroom_bytes=10 * S)
    assert decision.headroom == 2000
    assert decision.position == 4 * S and decision.blocked_by is None
    # Held back by the snapshot like any other cut.
    held = trim_point(segments, 2 * S + 10, by_size, NOW, headroom_bytes=10 * S)
    assert held.position == 2 * S and held.blocked_by == "snapshot"


def test_headroom_does_nothing_without_a_size_limit() -> None:
    segments = log_of(1, 1, 1)
    decision = trim_point(segments, 3 * S, AGE_ONLY, NOW, headroom_bytes=5 * S)
    assert not decision.deletes and decision.headroom == 0


def test_soft_watermark_frees_what_brings_the_disk_back_under() -> None:
    segments = log_of(1, 1, 1, 1, 1)
    young = RetentionSettings(retention_ms=72 * HOUR_MS, soft_ratio=0.75)
    # 80% of 10,000 used: 500 bytes over 75%, one 1000-byte segment frees it.
    disk = DiskUsage(total_bytes=10_000, used_bytes=8_000, free_bytes=2_000)
    decision = trim_point(segments, 5 * S, young, NOW, disk)
    assert decision.position == S and decision.reasons == ("disk_soft",)
    # 95%: 2000 over, two segments.
    full = DiskUsage(10_000, 9_500, 500)
    assert trim_point(segments, 5 * S, young, NOW, full).position == 2 * S
    # Under the soft ratio nothing goes early.
    calm = DiskUsage(10_000, 7_000, 3_000)
    assert not trim_point(segments, 5 * S, young, NOW, calm).deletes


def test_soft_watermark_is_still_held_by_the_snapshot() -> None:
    segments = log_of(1, 1, 1, 1, 1)
    full = DiskUsage(10_000, 9_900, 100)
    decision = trim_point(segments, S + 1, RetentionSettings(), NOW, full)
    assert decision.position == S and decision.wanted == 3 * S
    assert decision.blocked_by == "snapshot"


def test_the_furthest_rule_wins_and_every_rule_that_wants_is_named() -> None:
    segments = log_of(100, 100, 1, 1, 1, 1)
    settings_ = RetentionSettings(retention_ms=72 * HOUR_MS, retention_bytes=3000)
    decision = trim_point(segments, 6 * S, settings_, NOW)
    assert decision.position == 3 * S and decision.reasons == ("age", "size")


def test_a_log_that_already_lost_its_head_keeps_its_positions() -> None:
    segments = log_of(100, 100, 1, first=40 * S)
    decision = trim_point(segments, 50 * S, AGE_ONLY, NOW)
    assert (decision.first, decision.position) == (40 * S, 42 * S)


def test_disk_usage_ratio_is_dfs_use_percent() -> None:
    # df: used / (used + available); root's reserve counts as full.
    assert DiskUsage(1000, 500, 400).ratio == pytest.approx(500 / 900)
    assert DiskUsage(0, 0, 0).ratio == 0.0


def test_segment_floor() -> None:
    assert [segment_floor(p, S) for p in (0, 999, 1000, 2500)] == [0, 0, 1000, 2000]


@st.composite
def logs(draw):
    n = draw(st.integers(1, 12))
    first = draw(st.integers(0, 5)) * S
    lengths = draw(st.lists(st.integers(1, S), min_size=n, max_size=n))
    ages = draw(st.lists(st.integers(0, 200 * HOUR_MS), min_size=n, max_size=n))
    segments = [Seg(first + i * S, lengths[i], 1 + i, NOW - ages[i]) for i in range(n)]
    snapshot = draw(st.none() | st.integers(first, first + (n + 1) * S))
    used = draw(st.integers(0, 10_000))
    disk = draw(st.none() | st.just(DiskUsage(10_000, used, 10_000 - used)))
    config = RetentionSettings(retention_ms=draw(st.sampled_from([0, HOUR_MS, 72 * HOUR_MS])),
                               retention_bytes=draw(st.integers(0, 8 * S)),
                               soft_ratio=draw(st.sampled_from([0.5, 0.75, 1.0])))
    headroom = draw(st.integers(0, 4 * S))
    return segments, snapshot, disk, config, headroom


@settings(max_examples=400, deadline=None)
@given(logs())
def test_the_decision_never_breaks_a_safety_rule(case) -> None:
    segments, snapshot, disk, config, headroom = case
    decision = trim_point(segments, snapshot, config, NOW, disk, headroom)
    bases = [s.base for s in segments]
    # A segment base, at or after the first, never past the last segment.
    assert decision.position in bases
    assert segments[0].base <= decision.position <= segments[-1].base
    gone = [s for s in segments if s.base < decision.position]
    # Everything that goes is covered by the snapshot.
    assert all(snapshot is not None and s.base + s.length <= snapshot for s in gone)
    # Only what some rule asked for goes.
    assert (decision.position > segments[0].base) == decision.deletes
    if decision.deletes:
        assert decision.reasons
    if config.retention_ms == 0 and config.retention_bytes == 0 and (
            disk is None or disk.ratio <= config.soft_ratio):
        assert not decision.deletes
    # What the size rule keeps fits the limit less the headroom, unless a
    # safety rule held it back.
    if "size" in decision.reasons and decision.blocked_by is None:
        kept = sum(s.length for s in segments if s.base >= decision.position)
        room = config.retention_bytes - min(headroom, config.retention_bytes // 2)
        assert kept <= room or decision.wanted > decision.position


# ------------------------------------------------------------- configuration

BASE = {
    "group": "g", "node_id": 1, "data_dir": "/tmp/x",
    "peers": {"1": {"raft": "127.0.0.1:1", "client": "127.0.0.1:2"}},
}


def test_retention_keys_default_like_rocketmq() -> None:
    config = parse_config(BASE)
    assert (config.retention_hours, config.retention_bytes) == (72, 0)
    assert (config.disk_soft_ratio, config.disk_hard_ratio) == (0.75, 0.85)
    assert config.retention_interval_ms == 10_000
    assert RetentionSettings.from_config(config) == RetentionSettings(
        72 * HOUR_MS, 0, 0.75, 0.85)


def test_retention_keys_round_trip_through_toml(tmp_path) -> None:
    values = {"group": "g", "node_id": 1, "data_dir": "d", "retention_hours": 0.5,
              "retention_bytes": 1 << 30, "disk_soft_ratio": 0.6, "disk_hard_ratio": 0.9,
              "retention_interval_ms": 500}
    text = render_config(values, {1: Peer("h:1", "h:2")})
    import tomllib
    config = parse_config(tomllib.loads(text))
    assert RetentionSettings.from_config(config) == RetentionSettings(
        HOUR_MS // 2, 1 << 30, 0.6, 0.9)
    assert config.retention_interval_ms == 500
    assert isinstance(BrokerConfig(group="g", node_id=1, data_dir="d",
                                   peers={1: Peer("h:1", "h:2")}), BrokerConfig)


@pytest.mark.parametrize("change, message", [
    ({"retention_hours": -1}, "retention_hours"),
    ({"retention_hours": "72h"}, "retention_hours"),
    ({"retention_bytes": -5}, "retention_bytes"),
    ({"retention_bytes": 1.5}, "retention_bytes"),
    ({"disk_soft_ratio": 1.5}, "disk_soft_ratio"),
    ({"disk_hard_ratio": 0}, "disk_hard_ratio"),
    ({"disk_soft_ratio": 0.9, "disk_hard_ratio": 0.8}, "must not exceed"),
    ({"retention_interval_ms": 0}, "retention_interval_ms"),
    ({"disk_hard_ratio": True}, "disk_hard_ratio"),
])
def test_bad_retention_keys_are_named(change, message) -> None:
    with pytest.raises(BrokerConfigError, match=message):
        parse_config({**BASE, **change})
