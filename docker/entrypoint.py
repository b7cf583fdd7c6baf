#!/usr/bin/env python3
"""Container entry point: one image, every role, configured by file or environment.

    namesrv              ledgermq namesrv on $LEDGERMQ_NAMESRV_LISTEN (0.0.0.0:9876)
    broker [--config F]  ledgermq broker with F, or $LEDGERMQ_CONFIG when that file
                         exists, or a TOML file rendered from LEDGERMQ_* variables
    health               PING the address the running role listens on (HEALTHCHECK)
    render-config        print the TOML the environment describes (for checking)
    anything else        run as given (`ledgermq status …`, `bash`, …)

Rendering from the environment exists so a compose file can describe a whole
group without one mounted file per node; every variable is documented in
docs/deploy.md. Servers listen on 0.0.0.0 inside the container and *advertise*
the addresses in LEDGERMQ_PEERS, which is what lets the same file work on one
docker network (container addresses) and across hosts (host addresses with
published ports). The process is exec'd, so it is PID 1's only child and gets
docker's signals directly (SIGTERM on stop, SIGKILL on kill).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

DEFAULT_CLIENT_PORT = 10911
DEFAULT_RAFT_PORT = 20911
DEFAULT_NAMESRV_LISTEN = "0.0.0.0:9876"
DEFAULT_DATA_DIR = "/var/lib/ledgermq/data"
DEFAULT_CONFIG = "/etc/ledgermq/broker.toml"
# Where the running role records the address its health check pings.
HEALTH_FILE = Path(os.environ.get("LEDGERMQ_HEALTH_FILE", "/tmp/ledgermq.health"))

# Shortcut variables for the common top-level keys (docs/configuration.md).
TOP_LEVEL = {
    "LEDGERMQ_GROUP": "group",
    "LEDGERMQ_NODE_ID": "node_id",
    "LEDGERMQ_CLUSTER": "cluster",
    "LEDGERMQ_DATA_DIR": "data_dir",
    "LEDGERMQ_FLUSH": "flush",
    "LEDGERMQ_REPLICATE": "replicate",
    "LEDGERMQ_LOG_LEVEL": "log_level",
}
# LEDGERMQ_CONF_<KEY>=v sets any other top-level key, LEDGERMQ_RAFT_<KEY>=v a [raft] key.
CONF_PREFIX = "LEDGERMQ_CONF_"
RAFT_PREFIX = "LEDGERMQ_RAFT_"


class ConfigError(ValueError):
    """The environment does not describe a valid broker."""


def _scalar(text: str) -> int | bool | str:
    """Environment strings to TOML scalars: integers and booleans as such."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_peers(spec: str, client_port: int, raft_port: int) -> dict[int, tuple[str, str]]:
    """'1=HOST[:CLIENT[:RAFT]],2=…' -> {id: (raft address, client address)}."""
    peers: dict[int, tuple[str, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        nid, sep, where = item.partition("=")
        if not sep or not nid.strip().isdigit() or not where:
            raise ConfigError(f"LEDGERMQ_PEERS item {item!r}: expected ID=HOST[:CLIENT[:RAFT]]")
        host, *ports = where.strip().split(":")
        if len(ports) > 2 or not all(p.isdigit() for p in ports) or not host:
            raise ConfigError(f"LEDGERMQ_PEERS item {item!r}: expected ID=HOST[:CLIENT[:RAFT]]")
        client = int(ports[0]) if ports else client_port
        raft = int(ports[1]) if len(ports) > 1 else raft_port
        peers[int(nid)] = (f"{host}:{raft}", f"{host}:{client}")
    if not peers:
        raise ConfigError("LEDGERMQ_PEERS is empty: name every node of the group")
    return peers


def render_broker_config(env: Mapping[str, str]) -> str:
    """The broker TOML the LEDGERMQ_* variables describe."""
    missing = [name for name in ("LEDGERMQ_GROUP", "LEDGERMQ_NODE_ID", "LEDGERMQ_PEERS")
               if not env.get(name)]
    if missing:
        raise ConfigError(f"set {', '.join(missing)} (or mount a config file at "
                          f"{env.get('LEDGERMQ_CONFIG', DEFAULT_CONFIG)})")
    client_port = int(env.get("LEDGERMQ_CLIENT_PORT", DEFAULT_CLIENT_PORT))
    raft_port = int(env.get("LEDGERMQ_RAFT_PORT", DEFAULT_RAFT_PORT))
    peers = parse_peers(env["LEDGERMQ_PEERS"], client_port, raft_port)
    values: dict[str, object] = {"data_dir": DEFAULT_DATA_DIR}
    for var, key in TOP_LEVEL.items():
        if env.get(var):
            values[key] = _scalar(env[var])
    if not isinstance(values["node_id"], int) or values["node_id"] not in peers:
        raise ConfigError(f"LEDGERMQ_NODE_ID={env['LEDGERMQ_NODE_ID']} is not an id "
                          f"in LEDGERMQ_PEERS ({sorted(peers)})")
    values["group"] = str(values["group"])
    if env.get("LEDGERMQ_NAMESRV"):
        values["namesrv"] = [a.strip() for a in env["LEDGERMQ_NAMESRV"].split(",") if a.strip()]
    raft: dict[str, object] = {}
    for var, text in sorted(env.items()):
        if var.startswith(CONF_PREFIX) and len(var) > len(CONF_PREFIX):
            values[var[len(CONF_PREFIX):].lower()] = _scalar(text)
        elif var.startswith(RAFT_PREFIX) and len(var) > len(RAFT_PREFIX) \
                and var != "LEDGERMQ_RAFT_PORT":
            raft[var[len(RAFT_PREFIX):].lower()] = _scalar(text)
    # Listen on every interface of the container on this node's own ports, and
    # advertise the LEDGERMQ_PEERS addresses (which may be a host's address).
    own_client = peers[int(values["node_id"])][1]  # type: ignore[index]
    values.setdefault("listen", "0.0.0.0:" + own_client.rsplit(":", 1)[1])
    raft.setdefault("bind_host", "0.0.0.0")
    lines = [f"{key} = {_toml(value)}" for key, value in values.items()]
    lines += ["", "[raft]", *(f"{key} = {_toml(value)}" for key, value in raft.items())]
    for nid, (raft_addr, client_addr) in sorted(peers.items()):
        lines += ["", f"[peers.{nid}]", f"raft = {_toml(raft_addr)}",
                  f"client = {_toml(client_addr)}"]
    return "\n".join(lines) + "\n"


def _config_path(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _listen_from_config(path: str) -> str:
    import tomllib

    with open(path, "rb") as fh:
        config = tomllib.load(fh)
    listen = config.get("listen") or config["peers"][str(config["node_id"])]["client"]
    return "127.0.0.1:" + listen.rsplit(":", 1)[1]


def _ledgermq() -> str:
    return shutil.which("ledgermq") or "ledgermq"


def _exec(argv: list[str]) -> None:
    sys.stdout.flush()
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> int:
    env = os.environ
    role, args = (argv[0], argv[1:]) if argv else ("help", [])
    if role == "namesrv":
        listen = env.get("LEDGERMQ_NAMESRV_LISTEN", DEFAULT_NAMESRV_LISTEN)
        HEALTH_FILE.write_text("127.0.0.1:" + listen.rsplit(":", 1)[1])
        cmd = [_ledgermq(), "namesrv", "--listen", listen,
               "--broker-expiry-ms", env.get("LEDGERMQ_BROKER_EXPIRY_MS", "30000"),
               "--log-level", env.get("LEDGERMQ_LOG_LEVEL", "INFO"), *args]
        _exec(cmd)
    if role == "broker":
        config = _config_path(args)
        if config is None:
            config = env.get("LEDGERMQ_CONFIG", DEFAULT_CONFIG)
            if not Path(config).is_file():
                try:
                    text = render_broker_config(env)
                except (ConfigError, ValueError) as exc:
                    print(f"ledgermq-entrypoint: {exc}", file=sys.stderr)
                    return 2
                config = str(Path(env.get("LEDGERMQ_RENDERED_CONFIG", "/tmp/broker.toml")))
                Path(config).write_text(text)
                print(f"ledgermq-entrypoint: rendered {config} from the environment:\n{text}",
                      flush=True)
            args = ["--config", config, *args]
        HEALTH_FILE.write_text(_listen_from_config(config))
        _exec([_ledgermq(), "broker", *args])
    if role == "health":
        address = HEALTH_FILE.read_text().strip() if HEALTH_FILE.exists() else ""
        if not address:
            print("ledgermq-entrypoint: no role has started yet", file=sys.stderr)
            return 1
        _exec([_ledgermq(), "ping", address, "--timeout", "3"])
    if role == "render-config":
        try:
            sys.stdout.write(render_broker_config(env))
        except ConfigError as exc:
            print(f"ledgermq-entrypoint: {exc}", file=sys.stderr)
            return 2
        return 0
    if role in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    _exec(argv)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
