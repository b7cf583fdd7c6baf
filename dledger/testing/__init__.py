"""Test support for the Raft core: the seeded cluster simulator and the transcript environment.

Public so that other tiers (chaos/, the broker's tests) can reuse them, as
etcd's `rafttest` and `trio.testing` are.
"""

from dledger.testing.cluster import SimCluster
from dledger.testing.disk import SimDisk
from dledger.testing.network import SimNetwork
from dledger.testing.simulator import RunResult, SimOptions, replay_hint, run_seed

__all__ = [
    "RunResult",
    "SimCluster",
    "SimDisk",
    "SimNetwork",
    "SimOptions",
    "replay_hint",
    "run_seed",
]
