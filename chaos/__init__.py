"""Chaos harness: real broker clusters, injected faults, recorded histories, checkers.

Layout, one job per module:

- `history`: the operation record (JSON Lines, the format docs/audit.md reads)
- `checker`: total-queue and offset anomalies over a history
- `stats`: latency, throughput and unavailability over time
- `report`: results.json, plots and index.html of one run
- `backend`, `netns`, `proxy`, `disk_faults`: how faults reach real processes
- `nemesis`, `schedule`: named faults and when they start and stop
- `workload`, `runner`: producers, consumers, the drain, and one whole run
- `matrix`: the long evidence matrix

`chaos` uses the system from outside, as a user would: it starts `ledgermq`
processes, talks to them with the client SDK, and reads their files only to
cut them like a power failure would.
"""
