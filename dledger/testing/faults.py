"""Named timing and fault profiles of the simulator: the one place their ranges live.

Units are simulated time. A node ticks every 7-13 units (about 10), so the
election timeout of 10 ticks is 100-200 units and a healthy round trip is
2-20 units. The "classic" profile is the simulator as first built: fsync
(1-6) always shorter than a message (1-10), reordering of about 10 units and
no pauses, which is why some bugs hid (issue 13). The other profiles stretch
one dimension each, past the boundary a bug needs to show itself:

- slow_disk: fsyncs sometimes far longer than a round trip, so a node acts
  on what peers acknowledged while its own write is still in flight;
- slow_network: message delays with a tail past an election timeout, so a
  stale request or answer arrives after the world has moved on;
- reorder: independent delays over about 150 units, wide reordering;
- pauses: a node stops processing ticks, messages and fsync completions for
  up to 6 election timeouts and resumes with a burst (GC or VM pause);
- mixed: a bit of every dimension at once.

`draw_profile(rng)` picks one per seed from the seeded rng, so a run stays a
pure function of its seed. docs/raft.md ("Fault profiles") lists the same
table; keep them in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class FaultProfile:
    """Timing of disks, network and processes for one run."""

    name: str
    # fsync latency; with probability slow_fsync_probability a draw from slow_fsync_units.
    fsync_units: Range = (1, 6)
    slow_fsync_probability: float = 0.0
    slow_fsync_units: Range = (1, 6)
    # One-way message delay per channel (independent per message: reordering).
    delay_control: Range = (1, 4)
    delay_replication: Range = (1, 10)
    # Tail: with this probability a message takes long_delay_units instead.
    long_delay_probability: float = 0.0
    long_delay_units: Range = (100, 400)
    # Process pauses: share of nemesis actions that pause a node, and how long.
    pause_probability: float = 0.0
    pause_units: Range = (50, 600)
    # Clock skew: each node's tick period is drawn from this range.
    tick_period_units: Range = (7, 13)
    # Chance per leader broadcast of a stale append (an older, still legal
    # slice of the leader's log; see SimCluster._stale_append).
    stale_append_probability: float = 0.0

    def fsync_delay(self, rng: random.Random) -> int:
        if self.slow_fsync_probability and rng.random() < self.slow_fsync_probability:
            return rng.randint(*self.slow_fsync_units)
        return rng.randint(*self.fsync_units)


CLASSIC = FaultProfile("classic")

PROFILES: dict[str, FaultProfile] = {
    "classic": CLASSIC,
    "slow_disk": FaultProfile(
        "slow_disk",
        fsync_units=(2, 20),
        slow_fsync_probability=0.2,
        slow_fsync_units=(40, 300),
    ),
    "slow_network": FaultProfile(
        "slow_network",
        delay_control=(1, 15),
        delay_replication=(2, 40),
        long_delay_probability=0.03,
        long_delay_units=(100, 400),
        stale_append_probability=0.05,
    ),
    "reorder": FaultProfile(
        "reorder",
        delay_control=(1, 40),
        delay_replication=(1, 150),
        stale_append_probability=0.1,
    ),
    "pauses": FaultProfile(
        "pauses",
        pause_probability=0.35,
        pause_units=(50, 600),
    ),
    "mixed": FaultProfile(
        "mixed",
        fsync_units=(1, 15),
        slow_fsync_probability=0.1,
        slow_fsync_units=(30, 200),
        delay_control=(1, 10),
        delay_replication=(1, 60),
        long_delay_probability=0.01,
        long_delay_units=(100, 300),
        pause_probability=0.15,
        pause_units=(50, 400),
        tick_period_units=(5, 15),
        stale_append_probability=0.05,
    ),
}

# Per-seed mix: the classic profile keeps a share so old behaviour stays covered.
MIX: tuple[tuple[str, int], ...] = (
    ("classic", 2),
    ("slow_disk", 2),
    ("slow_network", 1),
    ("reorder", 2),
    ("pauses", 1),
    ("mixed", 2),
)


def draw_profile(rng: random.Random, name: str | None = None) -> FaultProfile:
    """The profile `name`, or one drawn from `MIX` with `rng` (weights as listed)."""
    if name is not None:
        if name not in PROFILES:
            raise ValueError(f"unknown fault profile {name!r}; known: {', '.join(PROFILES)}")
        return PROFILES[name]
    names = [n for n, _ in MIX]
    weights = [w for _, w in MIX]
    return PROFILES[rng.choices(names, weights)[0]]
