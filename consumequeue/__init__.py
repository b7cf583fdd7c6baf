"""ConsumeQueues: per-(topic, queue) fixed-width indexes built from committed entries."""

from consumequeue.checkpoint import DispatchCheckpoint
from consumequeue.queue import ConsumeQueue, Unit
from consumequeue.store import ConsumeQueueStore, DispatchRecovery, units_of_entry
from consumequeue.unit import UNIT_DTYPE, UNIT_SIZE

__all__ = [
    "UNIT_DTYPE",
    "UNIT_SIZE",
    "ConsumeQueue",
    "ConsumeQueueStore",
    "DispatchCheckpoint",
    "DispatchRecovery",
    "Unit",
    "units_of_entry",
]
