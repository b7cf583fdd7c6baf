"""Every nemesis a run can name: the faults (chaos.nemesis) and the membership
changes (chaos.membership), parsed from `--nemesis NAME[:k=v+k=v][,NAME...]`.

Kept apart from both so that neither imports the other's registry: the
evidence matrix iterates over the faults alone (its membership cells are a
dimension of their own, `--membership`).
"""

from __future__ import annotations

from chaos import membership, nemesis
from chaos.nemesis import Nemesis

REGISTRY: dict[str, type[Nemesis]] = {**nemesis.REGISTRY, **membership.REGISTRY}


def parse(spec: str) -> list[Nemesis]:
    """'kill-leader,grow:target=5' -> nemesis instances, any of `REGISTRY`."""
    return nemesis.parse(spec, REGISTRY)
