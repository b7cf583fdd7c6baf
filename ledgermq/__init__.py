"""LedgerMQ: a RocketMQ-style message broker whose CommitLog is replicated by Raft.

This package holds what every server and tool shares: the command line
(`ledgermq.cli`), configuration and the wire framing. The storage engine lives
in `commitlog` and `consumequeue`, consensus in `election` and `dledger`.
"""

__version__ = "0.1.0"
