"""Broker configuration: one TOML file per node, every key documented in
docs/configuration.md. `load_config` validates everything up front so that a
typo fails at start-up with the key's name, not later inside the Raft runtime.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from dledger.runtime.identity import check_cluster_id
from dledger.runtime.node import NodeConfig
from election.config import ElectionConfig
from ledgermq.base.address import AddressError, split_host_port
from ledgermq.base.small_file import NotReadable, read_small_file
from ledgermq.wire.limits import ServerLimits

MIB = 1024 * 1024


class BrokerConfigError(ValueError):
    """The configuration file is missing a key or has a wrong value."""


@dataclass(frozen=True)
class Peer:
    """One node of the group: where its Raft transport and its clients connect."""

    raft: str
    client: str


@dataclass(frozen=True)
class BrokerConfig:
    group: str
    node_id: int
    data_dir: str
    peers: Mapping[int, Peer]
    cluster: str = "DefaultCluster"
    # The group's first voters, used only the first time the group starts
    # (later the configuration lives in the log: docs/operations.md,
    # "Membership changes"). Empty: every node in [peers]. A node listed in
    # [peers] but not here starts as a spare: it never campaigns and waits to
    # be added with `ledgermq member add`.
    initial_members: tuple[int, ...] = ()
    # The cluster identity written into the data directory at its first use
    # (IDENTITY, docs/operations.md): a node refuses a directory of another
    # cluster id. "" = "<cluster>/<group>" (each broker group is a Raft group
    # of its own); set it to keep the old identity across a rename.
    cluster_id: str = ""
    # Client listen address; default: this node's `client` address in peers.
    listen: str = ""
    # Raft bind host; default: the host of this node's `raft` address.
    raft_bind_host: str = ""
    namesrv: tuple[str, ...] = ()
    flush: str = "sync"
    # flush="async": the background flusher's period and byte threshold.
    flush_interval_ms: int = 200
    flush_bytes: int = 4 * MIB
    # The CommitLog's share of the page cache (0: the kernel's business).
    page_cache_tail_bytes: int = 1024 * MIB
    replicate: str = "sync"
    # What a replica does when the group's log contradicts entries it had
    # committed (CommittedDivergence): "stop" (fail, keep everything for an
    # operator), "rollback" (set the diverged tail aside, rebuild from the
    # group's log, restart itself), "" = rollback with flush="async" (whose
    # contract allows the loss), stop with flush="sync" (where it means a disk
    # lied). See docs/configuration.md.
    on_divergence: str = ""
    tick_ms: int = 50
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 1
    # A follower that sees every connection with its leader closed for this
    # many ticks campaigns within `lost_leader_ticks` instead of an election
    # timeout (0: off). The node's defaults, not copies of them.
    leader_lost_grace_ticks: int = NodeConfig.leader_lost_grace_ticks
    lost_leader_ticks: int = NodeConfig.lost_leader_ticks
    # A follower applies committed entries in batches of at most this long
    # (docs/raft.md, "The loop"; 0: at once).
    follower_apply_delay_ms: int = NodeConfig.follower_apply_delay_ms
    # The leader batches new entries to the followers its commit does not
    # need (docs/raft.md, "Reserves"; 0: every follower gets each at once).
    reserve_batch_entries: int = NodeConfig.reserve_batch_entries
    reserve_batch_bytes: int = NodeConfig.reserve_batch_bytes
    preferred_leader: int = 0
    segment_size_bytes: int = 256 * MIB
    message_size_bytes_max: int = 4 * MIB
    auto_create_topics: bool = True
    default_queues: int = 4
    long_poll_timeout_ms: int = 15_000
    pull_max_messages: int = 256
    batch_max_messages: int = 4096
    batch_max_bytes: int = 4 * MIB
    max_inflight_proposals: int = 2
    # After it sends entries or answers, the node polls its connections
    # this long before its loop may sleep (ledgermq/wire/busy_poll.py; 0: off).
    busy_poll_us: int = 100
    propose_timeout_ms: int = 3_000
    # A send that reaches this node while no leader is known (an election) or
    # while it leads but has not applied its first entry waits up to this
    # long for that to change, then is answered with the new leader (or
    # taken): a client retrying on the answer needs no polling (0: answer at once).
    write_hold_ms: int = 500
    namesrv_register_interval_ms: int = 1_000
    member_expiry_ms: int = 10_000
    dedup_window: int = 4096
    dedup_producers_max: int = 100_000
    cq_checkpoint_interval_ms: int = 1_000
    # Broker-state snapshots (docs/broker.md, "Snapshots"): one is written
    # after this many applied entries or this many bytes of log since the
    # last, whichever comes first (0: that trigger off; both 0: none). A start
    # replays only the log after the newest, so these bound start-up time.
    snapshot_interval_entries: int = 20_000
    snapshot_interval_bytes: int = 64 * MIB
    # Retention (broker/retention.py, docs/configuration.md "Retention"):
    # CommitLog segments older than `retention_hours` (by file mtime, as
    # RocketMQ's fileReservedTime; 0 = no age limit) or beyond
    # `retention_bytes` of segments (0 = no size limit) are deleted, oldest
    # first, once a snapshot covers them; above `disk_soft_ratio` of the disk
    # the oldest go early, above `disk_hard_ratio` new messages are refused
    # (DISK_FULL). The leader checks every `retention_interval_ms`.
    retention_hours: float = 72
    retention_bytes: int = 0
    disk_soft_ratio: float = 0.75
    disk_hard_ratio: float = 0.85
    retention_interval_ms: int = 10_000
    log_level: str = "INFO"
    # HTTP admin app (/metrics, /api/v1, dashboard); "" = not started.
    admin_listen: str = ""
    admin_token: str = ""
    reports_dir: str = ""
    # Security (docs/security.md). The cluster secret authenticates the
    # group's Raft peers to each other and the brokers to their NameServers;
    # with it set, every client connection must authenticate too.
    cluster_secret_file: str = ""
    # The bootstrap administrator: a user that exists outside the replicated
    # ACL (so the first users can be created), with this access key and the
    # secret in `admin_secret_file`.
    admin_access_key: str = "admin"
    admin_secret_file: str = ""
    # Listening on a non-loopback address without a cluster secret is refused
    # unless this is set (a loud warning is logged instead).
    allow_open: bool = False
    # TLS on the client port, the Raft port and the admin app when a
    # certificate is given; `tls_ca_file` verifies the other side (peers and,
    # when set, clients: mutual TLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    # With authentication on, /metrics and the report files of the admin app
    # need a signed request too (default: readable by scrapers, like the
    # dashboard's static files).
    metrics_auth: bool = False
    # Resource bounds of the client port (docs/security.md, "Bounded resources"): the
    # largest frame, the bytes all partial frames and requests in flight may
    # hold together, how long a started frame may take to arrive, how long a
    # connection may stay silent after HELLO, and connection caps.
    max_frame_bytes: int = 16 * MIB
    frame_memory_budget_bytes: int = 64 * MIB
    frame_read_timeout_ms: int = 30_000
    idle_timeout_ms: int = 300_000
    max_connections: int = 4096
    max_connections_per_address: int = 256

    def server_limits(self) -> ServerLimits:
        """The client port's bounds, for its RpcServer."""
        return ServerLimits(
            max_frame_bytes=self.max_frame_bytes,
            frame_memory_budget_bytes=self.frame_memory_budget_bytes,
            frame_read_timeout=self.frame_read_timeout_ms / 1000,
            idle_timeout=self.idle_timeout_ms / 1000,
            max_connections=self.max_connections,
            max_connections_per_address=self.max_connections_per_address,
        )

    @property
    def divergence_action(self) -> str:
        """"stop" or "rollback", with the flush-dependent default resolved."""
        if self.on_divergence:
            return self.on_divergence
        return "rollback" if self.flush == "async" else "stop"

    @property
    def identity_cluster_id(self) -> str:
        """The cluster id this node's data directory must carry."""
        return self.cluster_id or f"{self.cluster}/{self.group}"

    @property
    def client_address(self) -> str:
        return self.listen or self.peers[self.node_id].client

    def client_address_of(self, node_id: int) -> str | None:
        peer = self.peers.get(node_id)
        return peer.client if peer else None

    def raft_peers(self) -> dict[int, tuple[str, int]]:
        return {nid: split_address(p.raft) for nid, p in self.peers.items()}

    @property
    def bootstrap_voters(self) -> frozenset[int]:
        """The voters the group starts with (`initial_members`, default all peers)."""
        return frozenset(self.initial_members or self.peers)

    def with_overrides(self, **values: Any) -> BrokerConfig:
        """A copy with the given keys replaced (None values are ignored)."""
        changed = replace(self, **{k: v for k, v in values.items() if v is not None})
        validate(changed)
        return changed


def split_address(value: str) -> tuple[str, int]:
    """'host:port' -> (host, port); a bad value is a configuration error."""
    try:
        return split_host_port(value)
    except AddressError as exc:
        raise BrokerConfigError(str(exc)) from None


_RAFT_KEYS = {
    "tick_ms", "election_timeout_ticks", "heartbeat_interval_ticks", "preferred_leader",
    "leader_lost_grace_ticks", "lost_leader_ticks", "follower_apply_delay_ms", "bind_host",
    "reserve_batch_entries", "reserve_batch_bytes",
}
_TOP_LEVEL = {f.name for f in fields(BrokerConfig)} - {"peers", "raft_bind_host"} - _RAFT_KEYS
_TOP_LEVEL |= {"raft"}


def parse_config(raw: Mapping[str, Any]) -> BrokerConfig:
    """Build a BrokerConfig from the TOML document's mapping."""
    unknown = set(raw) - _TOP_LEVEL - {"peers"}
    if unknown:
        raise BrokerConfigError(f"unknown configuration keys: {sorted(unknown)}")
    values: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("raft", "peers")}
    raft = raw.get("raft", {})
    if not isinstance(raft, Mapping):
        raise BrokerConfigError("[raft] must be a table")
    bad = set(raft) - _RAFT_KEYS
    if bad:
        raise BrokerConfigError(f"unknown [raft] keys: {sorted(bad)}")
    for key, value in raft.items():
        values["raft_bind_host" if key == "bind_host" else key] = value
    for key in ("group", "node_id", "data_dir"):
        if key not in values:
            raise BrokerConfigError(f"missing required key {key!r}")
    raw_peers = raw.get("peers")
    if not isinstance(raw_peers, Mapping) or not raw_peers:
        raise BrokerConfigError("[peers] must list every node: [peers.<id>] raft=..., client=...")
    peers: dict[int, Peer] = {}
    for key, spec in raw_peers.items():
        if not (str(key).isascii() and str(key).isdigit()) or int(key) < 1:
            raise BrokerConfigError(f"peer id {key!r} must be a positive integer")
        if not isinstance(spec, Mapping) or not {"raft", "client"} <= set(spec):
            raise BrokerConfigError(f"[peers.{key}] needs 'raft' and 'client' addresses")
        peers[int(key)] = Peer(str(spec["raft"]), str(spec["client"]))
    values["peers"] = peers
    if "initial_members" in values:
        members = values["initial_members"]
        if not isinstance(members, list):
            raise BrokerConfigError("initial_members must be a list of node ids")
        values["initial_members"] = tuple(members)
    if isinstance(values.get("namesrv"), str):
        values["namesrv"] = (values["namesrv"],)
    values["namesrv"] = tuple(values.get("namesrv", ()))
    try:
        config = BrokerConfig(**values)
    except TypeError as exc:
        raise BrokerConfigError(str(exc)) from None
    validate(config)
    return config


# A broker configuration is a few dozen lines; anything this large is another file.
CONFIG_BYTES_MAX = 1 << 20


def load_config(path: str) -> BrokerConfig:
    """Read and validate a broker TOML file: a regular file (a device such as
    /dev/zero would be read until memory ran out, a FIFO would block) of at
    most CONFIG_BYTES_MAX bytes of UTF-8."""
    try:
        data = read_small_file(path, CONFIG_BYTES_MAX)
    except NotReadable as exc:
        raise BrokerConfigError(f"cannot read {path}: {exc}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BrokerConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                                ) from None
    except tomllib.TOMLDecodeError as exc:
        raise BrokerConfigError(f"{path}: {exc}") from None
    return parse_config(raw)


def _check_int(config: BrokerConfig, name: str, lo: int) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise BrokerConfigError(f"{name} must be an integer >= {lo}, got {value!r}")


def _check_number(config: BrokerConfig, name: str, lo: float, hi: float) -> float:
    value = getattr(config, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise BrokerConfigError(f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


# The longest election timeout a configuration may ask for (tick_ms times
# election_timeout_ticks): a group that waits longer than this to replace a
# dead leader is a typo, not a choice (one with 10**24 ticks never elected).
ELECTION_TIMEOUT_MS_MAX = 600_000
# The longest busy poll: a message later than this is not "prompt".
BUSY_POLL_US_MAX = 10_000


def _check_raft(config: BrokerConfig) -> None:
    """The [raft] keys as the Raft runtime would judge them (NodeConfig
    refused them with a traceback, after start-up had begun), and an
    election timeout an operator could wait for."""
    for name in ("tick_ms", "election_timeout_ticks", "heartbeat_interval_ticks",
                 "lost_leader_ticks", "reserve_batch_bytes"):
        _check_int(config, name, 1)
    for name in ("preferred_leader", "leader_lost_grace_ticks", "follower_apply_delay_ms",
                 "reserve_batch_entries"):
        _check_int(config, name, 0)
    timeout_ms = config.tick_ms * config.election_timeout_ticks
    if timeout_ms > ELECTION_TIMEOUT_MS_MAX:
        raise BrokerConfigError(
            f"[raft] tick_ms * election_timeout_ticks = {timeout_ms} ms is longer than the"
            f" longest election timeout allowed, {ELECTION_TIMEOUT_MS_MAX} ms")
    if config.preferred_leader and config.preferred_leader not in config.peers:
        raise BrokerConfigError(
            f"[raft] preferred_leader {config.preferred_leader} is not a node id in [peers]")
    try:
        ElectionConfig(election_timeout_ticks=config.election_timeout_ticks,
                       heartbeat_interval_ticks=config.heartbeat_interval_ticks,
                       lost_leader_ticks=config.lost_leader_ticks,
                       preferred_leader=config.preferred_leader)
    except ValueError as exc:
        raise BrokerConfigError(f"[raft] {exc}") from None


def _check_retention(config: BrokerConfig) -> None:
    _check_number(config, "retention_hours", 0, 1e6)
    _check_int(config, "retention_bytes", 0)
    soft = _check_number(config, "disk_soft_ratio", 0.01, 1.0)
    hard = _check_number(config, "disk_hard_ratio", 0.01, 1.0)
    if soft > hard:
        # Early deletion must start before writes are refused, or a disk
        # between the two would refuse writes without freeing anything.
        raise BrokerConfigError(
            f"disk_soft_ratio ({soft:g}) must not exceed disk_hard_ratio ({hard:g})")


def validate(config: BrokerConfig) -> None:
    if not isinstance(config.group, str) or not config.group:
        raise BrokerConfigError("group must be a non-empty string")
    _check_int(config, "node_id", 1)
    if not isinstance(config.cluster, str) or not isinstance(config.cluster_id, str):
        raise BrokerConfigError("cluster and cluster_id must be strings")
    try:
        check_cluster_id(config.identity_cluster_id)
    except ValueError as exc:
        raise BrokerConfigError(f"cluster_id: {exc}") from None
    if config.node_id not in config.peers:
        raise BrokerConfigError(f"node_id {config.node_id} is not in [peers]")
    for member in config.initial_members:
        if not isinstance(member, int) or isinstance(member, bool) or member not in config.peers:
            raise BrokerConfigError(
                f"initial_members: {member!r} is not a node id listed in [peers]")
    if config.flush not in ("sync", "async"):
        raise BrokerConfigError(f"flush must be 'sync' or 'async', not {config.flush!r}")
    if config.replicate not in ("sync", "async"):
        raise BrokerConfigError(f"replicate must be 'sync' or 'async', not {config.replicate!r}")
    if config.on_divergence not in ("", "stop", "rollback"):
        raise BrokerConfigError(
            f"on_divergence must be 'stop' or 'rollback', not {config.on_divergence!r}")
    _check_raft(config)
    for name in ("message_size_bytes_max", "default_queues",
                 "pull_max_messages",
                 "batch_max_messages", "batch_max_bytes", "max_inflight_proposals",
                 "propose_timeout_ms", "namesrv_register_interval_ms", "member_expiry_ms",
                 "dedup_window", "dedup_producers_max", "cq_checkpoint_interval_ms",
                 "flush_interval_ms", "flush_bytes", "frame_read_timeout_ms", "idle_timeout_ms",
                 "max_connections", "max_connections_per_address", "retention_interval_ms"):
        _check_int(config, name, 1)
    _check_retention(config)
    _check_int(config, "max_frame_bytes", 64 * 1024)
    _check_int(config, "frame_memory_budget_bytes", 1)
    try:
        config.server_limits()
    except ValueError as exc:
        raise BrokerConfigError(str(exc)) from None
    _check_int(config, "snapshot_interval_entries", 0)
    _check_int(config, "snapshot_interval_bytes", 0)
    _check_int(config, "busy_poll_us", 0)
    if config.busy_poll_us > BUSY_POLL_US_MAX:
        raise BrokerConfigError(
            f"busy_poll_us must be at most {BUSY_POLL_US_MAX} (a spin of milliseconds holds"
            f" a core for nothing), got {config.busy_poll_us}")
    _check_int(config, "long_poll_timeout_ms", 0)
    _check_int(config, "write_hold_ms", 0)
    _check_int(config, "page_cache_tail_bytes", 0)
    _check_int(config, "segment_size_bytes", 4096)
    if config.default_queues > 1024:
        raise BrokerConfigError("default_queues must be at most 1024")
    if not isinstance(config.auto_create_topics, bool):
        raise BrokerConfigError("auto_create_topics must be true or false")
    for peer in config.peers.values():
        split_address(peer.raft)
        split_address(peer.client)
    for address in config.namesrv:
        split_address(address)
    if config.listen:
        split_address(config.listen)
    if config.admin_listen:
        split_address(config.admin_listen)
    for name in ("admin_token", "reports_dir", "cluster_secret_file", "admin_access_key",
                 "admin_secret_file", "tls_cert_file", "tls_key_file", "tls_ca_file"):
        if not isinstance(getattr(config, name), str):
            raise BrokerConfigError(f"{name} must be a string")
    for name in ("allow_open", "metrics_auth"):
        if not isinstance(getattr(config, name), bool):
            raise BrokerConfigError(f"{name} must be true or false")
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise BrokerConfigError("tls_cert_file and tls_key_file are given together")


def render_config(values: Mapping[str, Any], peers: Mapping[int, Peer],
                  raft: Mapping[str, Any] | None = None) -> str:
    """A TOML document for these values (used by the local-cluster launcher)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    if raft:
        lines.append("\n[raft]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in raft.items()]
    for nid, peer in sorted(peers.items()):
        lines.append(f"\n[peers.{nid}]")
        lines.append(f"raft = {_toml_value(peer.raft)}")
        lines.append(f"client = {_toml_value(peer.client)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # finite floats only: validate() bounds every float key
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r} as TOML")
