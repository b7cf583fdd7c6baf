"""The nightly range selection (``rotation``): for any sequence of nights, cuts and
retention points, every retained index is re-verified within N nights, a night's load
is about V / N, and retention's deletions are dropped, never taken for losses."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_audit import digest, rotation
from spark_audit.rotation import Aged

# One night: how far the commit moved, how far retention's floor moved (both >= 0).
NIGHT = st.tuples(st.integers(0, 400), st.integers(0, 300))


def covered(spans: list[Aged]) -> set[int]:
    return {i for s in spans for i in range(s.lo, s.hi + 1)}


@settings(max_examples=300, deadline=None)
@given(nights=st.lists(NIGHT, min_size=1, max_size=25), n=st.integers(1, 6),
       block=st.sampled_from([1, 8, 64, 1024]))
def test_every_retained_index_is_reverified_within_n_nights(nights, n, block) -> None:
    spans: list[Aged] = []
    through = commit = 0
    floor = 1
    for t, (grow, trim) in enumerate(nights, start=1):
        commit += grow
        # Retention deletes only what a snapshot covers: never past the commit.
        floor = min(floor + trim, commit + 1)
        before = covered(spans)
        kept, dropped = rotation.trim(spans, floor)
        # Dropped: exactly what lay below the floor; nothing retained is lost.
        assert covered(kept) == {i for i in before if i >= floor}
        assert {i for a, b in dropped for i in range(a, b + 1)} == {
            i for i in before if i < floor}
        chosen = rotation.select(kept, t, n)
        assert sum(s.size for s in chosen) >= rotation.quota(kept, n)
        due = {(s.lo, s.hi) for s in kept if s.night_no <= t - n}
        assert due <= {(s.lo, s.hi) for s in chosen}
        picked = {(s.lo, s.hi) for s in chosen}
        spans = [Aged(s.lo, s.hi, t) if (s.lo, s.hi) in picked else s for s in kept]
        new = rotation.new_range(through, floor, commit)
        if new is not None:
            spans += [Aged(a, b, t) for a, b in digest.split(*new, block)]
            assert new[0] == max(through + 1, floor)
        through = max(through, commit)
        # After the night: the retained, verified log is covered without a hole, and
        # every index of it was verified within the last n nights.
        spans.sort(key=lambda s: s.lo)
        if through >= floor:
            assert covered(spans) == set(range(floor, through + 1))
        assert all(s.night_no > t - n for s in spans)


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(1, 10**6), length=st.integers(0, 5000),
       block=st.sampled_from([1, 2, 64, 1 << 16, 1 << 19]))
def test_spans_never_cross_a_block(lo, length, block) -> None:
    parts = digest.split(lo, lo + length - 1, block)
    assert sum(b - a + 1 for a, b in parts) == length
    assert all(a // block == b // block for a, b in parts)
    assert all(p[1] + 1 == q[0] for p, q in itertools.pairwise(parts))


def test_the_stalest_spans_go_first_and_make_contiguous_windows() -> None:
    spans = [Aged(1, 100, 3), Aged(101, 200, 1), Aged(201, 300, 1), Aged(301, 400, 2)]
    # V = 400, N = 4: at least 100 indexes; the night-1 spans first, in index order.
    chosen = rotation.select(spans, 4, 4)
    assert [(s.lo, s.hi) for s in chosen] == [(101, 200)]
    assert rotation.windows(rotation.select(spans, 3, 2)) == [(101, 300)]
    # Everything verified N nights ago is taken, whatever the quota.
    assert rotation.windows(rotation.select(spans, 6, 4)) == [(101, 400)]
    # Where the rotation wraps from the top of the log back to its bottom: two windows.
    wrap = [Aged(1, 100, 2), Aged(101, 200, 3), Aged(201, 300, 1)]
    assert rotation.windows(rotation.select(wrap, 4, 2)) == [(1, 100), (201, 300)]
    assert rotation.select([], 1, 3) == []


def test_retention_trims_through_a_span() -> None:
    kept, dropped = rotation.trim([Aged(1, 100, 1), Aged(101, 200, 2), Aged(201, 300, 2)],
                                  150)
    assert kept == [Aged(150, 200, 2), Aged(201, 300, 2)]
    assert dropped == [(1, 149)]
    assert rotation.subtract(1, 100, [(20, 30), (90, 200)]) == [(1, 19), (31, 89)]
    assert rotation.new_range(100, 1, 100) is None
    assert rotation.new_range(100, 150, 300) == (150, 300)
