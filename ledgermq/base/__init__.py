"""The ground floor every LedgerMQ server and tool stands on: request and error
codes, the typed errors, task and event-loop helpers, free loopback ports.

It imports nothing of the project; everything else may import it.
"""
