"""One Raft node per process with a small control RPC (`python -m dledger.runtime.process`).

Used by the multi-process tests, `bench/failover.py` and the chaos harness to
run real nodes that can be SIGKILLed. The config is a JSON object with the
`NodeConfig` fields (`peers` as {"1": ["127.0.0.1", 7001], ...}) plus
`control` ("host:port", port 0 = any), where a `ledgermq.wire` RPC server
answers, optionally `initial_voters` (the first voters; others start as
spares) and `cluster_id` (the data directory's identity; default the group),
and optionally the Raft port's security as the broker names it:
`cluster_secret_file` (mode 0600) and `tls_cert_file` / `tls_key_file` /
`tls_ca_file`:

- 480 PROPOSE {"data": bytes, "timeout": seconds} -> {"index", "term", "position"};
  NOT_LEADER (data {"leader_id"}) or TIMEOUT (outcome unknown) on failure;
- 481 STATUS -> `RaftGroupNode.status()`;
- 482 ENTRIES {"lo", "hi"} -> [[index, term, body], ...] of committed entries
  in [lo, hi) (at most about 4 MiB per call).

Once listening it prints `raft-node <id> control <host>:<port>` on stdout.
SIGTERM or SIGINT stop the node cleanly (flush, checkpoint, close).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import commitlog
from dledger.runtime.identity import open_identity
from dledger.runtime.node import NodeConfig, NotLeaderError, ProposalUnknown, RaftGroupNode
from dledger.runtime.transport import tls_contexts
from ledgermq.base.address import split_host_port
from ledgermq.base.errors import InvalidRequestError, RequestTimeoutError
from ledgermq.base.loop import run
from ledgermq.wire.auth import read_secret_file
from ledgermq.wire.rpc import Connection, RpcServer

CONTROL_PROPOSE = 480
CONTROL_STATUS = 481
CONTROL_ENTRIES = 482
_ENTRIES_BYTES_MAX = 4 * 1024 * 1024

_KNOBS = ("flush", "replicate", "tick_ms", "election_timeout_ticks", "heartbeat_interval_ticks",
          "leader_lost_grace_ticks", "lost_leader_ticks", "preferred_leader",
          "segment_size_bytes", "bind_host", "reserve_batch_entries")


def load_config(raw: dict[str, Any]) -> tuple[NodeConfig, str, int]:
    """NodeConfig and control (host, port) from the JSON object."""
    peers = {int(k): (str(v[0]), int(v[1])) for k, v in raw["peers"].items()}
    knobs = {k: raw[k] for k in _KNOBS if k in raw}
    secret_file = str(raw.get("cluster_secret_file") or "")
    cert_file = str(raw.get("tls_cert_file") or "")
    tls_server, tls_client = (
        tls_contexts(cert_file, str(raw.get("tls_key_file") or ""),
                     str(raw.get("tls_ca_file") or ""))
        if cert_file else (None, None))
    config = NodeConfig(group=raw["group"], node_id=int(raw["node_id"]), peers=peers,
                        data_dir=raw["data_dir"],
                        cluster_secret=read_secret_file(secret_file) if secret_file else b"",
                        tls_server=tls_server, tls_client=tls_client,
                        initial_voters=frozenset(int(n) for n in raw.get("initial_voters", [])),
                        **knobs)
    host, port = split_host_port(str(raw.get("control", "127.0.0.1:0")), default_host="127.0.0.1")
    # The data directory's identity, as a broker checks it (refuses another
    # cluster's or node's directory; a new or wiped one gets a new id).
    opened = open_identity(config.data_dir, str(raw.get("cluster_id") or config.group),
                           config.node_id)
    return replace(config, directory_id=opened.identity.directory_id), host, port


async def serve(config: NodeConfig, control_host: str, control_port: int) -> None:
    applied = 0

    def apply(entries: Sequence[commitlog.Entry]) -> None:
        nonlocal applied
        applied += len(entries)

    node = RaftGroupNode(config, apply)

    async def propose(body: Any, conn: Connection) -> Any:
        if not isinstance(body, dict) or not isinstance(body.get("data"), bytes):
            raise InvalidRequestError("PROPOSE needs {'data': bytes}")
        try:
            entry = await node.propose(commitlog.KIND_MESSAGES, body["data"],
                                       timeout=float(body.get("timeout", 3.0)))
        except ProposalUnknown as exc:
            raise RequestTimeoutError(f"outcome unknown: {exc}") from None
        return {"index": entry.index, "term": entry.term, "position": entry.position}

    async def status(body: Any, conn: Connection) -> Any:
        return node.status().to_json()

    async def entries(body: Any, conn: Connection) -> Any:
        if not isinstance(body, dict):
            raise InvalidRequestError("ENTRIES needs {'lo': int, 'hi': int}")
        lo = max(1, int(body.get("lo", 1)))
        hi = min(int(body.get("hi", lo)), node.commit_index + 1, node.log.last_index + 1)
        if lo >= hi:
            return []
        return [[e.index, e.term, e.body]
                for e in node.log.read_entries(lo, hi, _ENTRIES_BYTES_MAX)]

    server = RpcServer(f"raft-node-{config.node_id}",
                       {CONTROL_PROPOSE: propose, CONTROL_STATUS: status, CONTROL_ENTRIES: entries})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start(0)
    host, port = await server.start(control_host, control_port)
    print(f"raft-node {config.node_id} control {host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close(grace=1.0)
        await node.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger.runtime.process")
    parser.add_argument("--config", required=True, help="JSON file (see module docstring)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.config) as f:
        config, host, port = load_config(json.load(f))
    run(serve(config, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CONTROL_ENTRIES", "CONTROL_PROPOSE", "CONTROL_STATUS", "NotLeaderError", "main"]
