"""The asyncio runtime that drives the sans-I/O Raft core on one machine.

`node.RaftGroupNode` turns the core's `Ready` batches into CommitLog writes,
fsyncs (through the Flusher) and messages; `transport` carries them over TCP
with `codec`'s framing; `storage` adapts the CommitLog to the core's Storage
protocol; `process` runs a node as a standalone process.
"""
