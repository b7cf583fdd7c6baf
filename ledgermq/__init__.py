"""LedgerMQ: a RocketMQ-style message broker whose CommitLog is replicated by Raft.

The product's own packages live under this namespace, one floor each (see
docs/architecture.md for the import graph): `base` and `wire` (the ground
floor), `webadmin` (the operations web app), `namesrv`, `broker`, `client`,
and `cli`, the top floor. The card's packages stay top-level: storage in
`commitlog` and `consumequeue`, consensus in `election` and `dledger`, the
chaos harness in `chaos` and the audit in `spark_audit`.
"""

__version__ = "0.1.0"
