"""Protocol fuzzers run against real server processes (docs/fuzzing.md).

Layout, one job per module:

- `values`: seeded random values: extreme integers, odd strings, deep nesting
- `bodies`: structure-aware request bodies for every `RequestCode`
- `wire_cases`: cases for the client protocol port (brokers and NameServer)
- `raft_cases`: cases for a broker's Raft peer port
- `http_cases`: cases for the admin HTTP apps
- `cases`: a case's identity (target kind, generator, seed) and how it is built
- `deliver`: one case over one TCP connection, and what came back
- `oracle`: acknowledged messages before and during the run, and the final checks
- `campaign`: the run loop, the seed log, the summary and the replay

Like the rest of `chaos`, it uses the system from outside: sockets and the
client SDK against processes someone else started (bench/fuzz.py, the tests).
Every case is a pure function of (generator, seed, context), so one line of
the seed log replays it.
"""
