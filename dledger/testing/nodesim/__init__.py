"""The real-node simulator: `RaftGroupNode`, its CommitLog, Flusher and
checkpoints, on virtual time, a simulated file system and a simulated network
(docs/raft.md, "The real-node simulator")."""

from dledger.testing.nodesim.harness import NodeSimOptions, NodeSimResult, replay_hint
from dledger.testing.nodesim.run import run_seed
from dledger.testing.nodesim.runtime_bugs import RUNTIME_BUGS

__all__ = ["RUNTIME_BUGS", "NodeSimOptions", "NodeSimResult", "replay_hint", "run_seed"]
