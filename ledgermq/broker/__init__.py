"""The LedgerMQ broker: one process per node of a Raft-replicated broker group.

`broker.server.Broker` composes the Raft node runtime, the ConsumeQueues and
the replicated state machine behind the client protocol; docs/broker.md
describes the design, docs/configuration.md the configuration file.
"""
