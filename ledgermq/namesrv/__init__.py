"""The NameServer: where brokers register and clients ask for routes.

`registry` is the sans-I/O route table (time is passed in); `server` exposes it
over the LedgerMQ wire protocol. Several NameServers run side by side without
talking to each other, as in RocketMQ: every broker registers with each of them.
"""
