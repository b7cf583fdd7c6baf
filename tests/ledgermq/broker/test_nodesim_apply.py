"""The broker's state machine under the real-node simulator with compaction:
snapshots are `BrokerState.to_snapshot`, installs rebuild the ConsumeQueues
from the installed log, and every replica ends with the same whole state
(the applier's summary digests its canonical snapshot encoding)."""

from __future__ import annotations

from dledger.testing.nodesim import NodeSimOptions, run_seed
from ledgermq.broker.nodesim_apply import BrokerApplier

COMPACTION = NodeSimOptions(nodes=3, compaction=True, segment_size=4096, applier=BrokerApplier)


def test_the_broker_state_machine_survives_compaction_and_installs() -> None:
    results = [run_seed(seed, COMPACTION) for seed in range(1, 31)]
    failed = [(r.seed, r.violation) for r in results if not r.ok]
    assert not failed, failed
    total = {key: sum(r.counts[key] for r in results)
             for key in ("snapshots", "compactions", "installs")}
    assert total["compactions"] > 0 and total["installs"] > 0, total


def test_a_damaged_queue_checkpoint_at_restart_is_rebuilt_to_the_same_queues() -> None:
    """Half the restarts find their ConsumeQueue checkpoint damaged (flipped,
    torn, emptied): recovery rebuilds every queue from the log, with and
    without compaction, and the simulator's checks (queues against the state
    machine's counts, every replica's whole state) still hold."""
    from functools import partial

    from ledgermq.broker.nodesim_apply import CheckpointRot

    rot = CheckpointRot(0.5)
    plain = NodeSimOptions(nodes=3, applier=partial(BrokerApplier, rot=rot))
    compacting = NodeSimOptions(nodes=3, compaction=True, segment_size=4096,
                                applier=partial(BrokerApplier, rot=rot))
    results = [run_seed(seed, options) for seed in range(1, 16)
               for options in (plain, compacting)]
    failed = [(r.seed, r.violation) for r in results if not r.ok]
    assert not failed, failed
    assert rot.damaged >= 10, rot.damaged
