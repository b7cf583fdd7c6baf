#!/usr/bin/env python3
"""Container entry point: one image, every role, configured by file or environment.

    namesrv              ledgermq namesrv on $LEDGERMQ_NAMESRV_LISTEN (0.0.0.0:9876)
    broker [--config F]  ledgermq broker with F, or $LEDGERMQ_CONFIG when that file
                         exists, or a TOML file rendered from LEDGERMQ_* variables
    spark-master         a Spark standalone master on $LEDGERMQ_SPARK_PORT (7077)
    spark-worker         a Spark worker of $LEDGERMQ_SPARK_MASTER, at idle priority
    audit-schedule       ledgermq audit schedule: the nightly audit of the live
                         brokers, configured by LEDGERMQ_AUDIT_* (docs/deploy.md)
    health               PING the address the running role listens on (HEALTHCHECK)
    render-config        print the TOML the environment describes (for checking)
    anything else        run as given (`ledgermq status …`, `bash`, …)

Authentication is on by default (docs/deploy.md, "Authentication"): a server
role uses the cluster secret at $LEDGERMQ_CLUSTER_SECRET_FILE and the bootstrap
administrator's secret at $LEDGERMQ_ADMIN_SECRET_FILE (both by default in
/var/lib/ledgermq-secrets, a volume the compose files share between all
containers), generating each one when it is missing. Any container may be
the first: a secret is written whole under a temporary name and then
hard-linked into place, which fails if another container got there first,
so every container ends up with the one secret and nobody ever reads half a
file. LEDGERMQ_ALLOW_OPEN=true runs without authentication (loudly).

Rendering from the environment exists so a compose file can describe a whole
group without one mounted file per node; every variable is documented in
docs/deploy.md. Servers listen on 0.0.0.0 inside the container and *advertise*
the addresses in LEDGERMQ_PEERS, which is what lets the same file work on one
docker network (container addresses) and across hosts (host addresses with
published ports). The process is exec'd, so it is PID 1's only child and gets
docker's signals directly (SIGTERM on stop, SIGKILL on kill).

The Spark and audit roles need the audit image (docker/build-image.sh
--audit: Java and PySpark). They read the brokers' volumes mounted read-only
at $LEDGERMQ_AUDIT_MOUNTS/<group>/<node> (/replicas), and see each one's data
directory as $LEDGERMQ_AUDIT_REPLICAS/<group>/<node> (/tmp/ledgermq-replicas,
a tree of symbolic links made at start), so that the audit names replicas
after their nodes and the driver and the executors open the same paths.
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
DEFAULT_SECRETS_DIR = "/var/lib/ledgermq-secrets"
DEFAULT_SPARK_PORT = 7077
DEFAULT_AUDIT_MOUNTS = "/replicas"
DEFAULT_AUDIT_REPLICAS = "/tmp/ledgermq-replicas"
DEFAULT_AUDIT_STATE = "/var/lib/ledgermq-audit"
# The Spark worker and its executors run at idle priority (as `ledgermq audit
# schedule` runs the driver): a broker on the same host keeps the CPU.
IDLE_PRIORITY = ["chrt", "--idle", "0", "ionice", "-c", "3", "nice", "-n", "19"]
ADMIN_ACCESS_KEY = "admin"
CLUSTER_ACCESS_KEY = "cluster"  # ledgermq.wire.auth.CLUSTER_KEY
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


def allow_open(env: Mapping[str, str]) -> bool:
    """LEDGERMQ_ALLOW_OPEN set to a true value: run without authentication."""
    return env.get("LEDGERMQ_ALLOW_OPEN", "").strip().lower() in ("1", "true", "yes", "on")


def secret_files(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(cluster secret file, admin secret file) the servers use, None when
    told to run open."""
    if allow_open(env):
        return None
    base = env.get("LEDGERMQ_SECRETS_DIR", DEFAULT_SECRETS_DIR)
    return (env.get("LEDGERMQ_CLUSTER_SECRET_FILE") or f"{base}/cluster.secret",
            env.get("LEDGERMQ_ADMIN_SECRET_FILE") or f"{base}/admin.secret")


def ensure_secret(path: str) -> bool:
    """Make sure `path` holds a secret; True when this call created it.

    Safe when several containers start at once on a shared volume: the secret
    is written (0600) and fsynced under a name of this process's own, then
    hard-linked to `path`. The link either appears with the whole content or
    fails because the file exists (another container won); either way every
    container then reads the same complete secret.
    """
    from ledgermq.wire.auth import write_secret_file

    target = Path(path)
    if target.exists():
        return False
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}")
    write_secret_file(temporary)
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, target)
        created = True
    except FileExistsError:
        created = False
    finally:
        temporary.unlink()
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the link itself survives a crash
    finally:
        os.close(fd)
    return created


def prepare_secrets(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Generate the missing secrets and say where they are (also the admin's);
    None when running open. OSError when the secrets directory is not writable."""
    files = secret_files(env)
    if files is None:
        print("ledgermq-entrypoint: LEDGERMQ_ALLOW_OPEN is set: running WITHOUT "
              "authentication; anyone who reaches these ports can read, write and delete "
              "data", flush=True)
        return None
    cluster, admin = files
    made = [name for name, path in (("cluster", cluster), ("admin", admin))
            if ensure_secret(path)]
    print(f"ledgermq-entrypoint: authentication on; cluster secret {cluster}, "
          f"administrator {env.get('LEDGERMQ_ADMIN_ACCESS_KEY', ADMIN_ACCESS_KEY)!r} "
          f"with the secret in {admin}"
          + (f" ({' and '.join(made)} secret generated now)" if made else "")
          + f". Copy it out with: docker exec <container> cat {admin} > admin.secret; "
          "chmod 600 admin.secret", flush=True)
    return files


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
    files = secret_files(env)
    if files is None:
        values.setdefault("allow_open", True)
    else:
        values.setdefault("cluster_secret_file", files[0])
        values.setdefault("admin_secret_file", files[1])
        if env.get("LEDGERMQ_ADMIN_ACCESS_KEY"):
            values.setdefault("admin_access_key", env["LEDGERMQ_ADMIN_ACCESS_KEY"])
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


def _health_from_config(path: str) -> list[str]:
    """What the health check pings for this broker config: the client port
    on loopback, authenticated with the cluster secret when it has one."""
    import tomllib

    with open(path, "rb") as fh:
        config = tomllib.load(fh)
    listen = config.get("listen") or config["peers"][str(config["node_id"])]["client"]
    return _health_lines("127.0.0.1:" + listen.rsplit(":", 1)[1],
                         config.get("cluster_secret_file", ""),
                         config.get("tls_ca_file", "") if config.get("tls_cert_file") else "")


def _health_lines(address: str, secret_file: str, tls_ca_file: str) -> list[str]:
    """HEALTH_FILE's content: the address, then `ledgermq ping` options. With
    the cluster key the ping checks the server's proof too: a server with
    another cluster's secret is unhealthy, not just a dead one."""
    options = [address]
    if secret_file:
        options += ["--access-key", CLUSTER_ACCESS_KEY, "--secret-file", secret_file]
    if tls_ca_file:
        options += ["--tls-ca-file", tls_ca_file]
    return options


def link_replicas(mounts: str, tree: str) -> list[str]:
    """Make `tree`/<group>/<node> a symbolic link to `mounts`/<group>/<node>/data
    for every mounted broker volume; the links made. A volume whose broker
    has not written yet gets its link too (it dangles until then)."""
    made = []
    root = Path(mounts)
    if not root.is_dir():
        return made
    for group in sorted(p for p in root.iterdir() if p.is_dir()):
        for node in sorted(p for p in group.iterdir() if p.is_dir()):
            link = Path(tree) / group.name / node.name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink():
                link.unlink()
            link.symlink_to(node / "data", target_is_directory=True)
            made.append(str(link))
    return made


def container_address() -> str:
    """This container's address on its network (what peers reach it at)."""
    import socket

    return socket.gethostbyname(socket.gethostname())


def spark_class() -> str:
    """The pyspark distribution's bin/spark-class (the audit image has it)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigError("this image has no PySpark: the Spark roles need the audit image "
                          "(docker/build-image.sh --audit)")
    return str(Path(spec.origin).parent / "bin" / "spark-class")


def spark_env(env: Mapping[str, str], host: str) -> None:
    """What every Spark process of this container needs: its address, the
    venv's interpreter for Python workers, daemons in the foreground."""
    os.environ["SPARK_HOME"] = str(Path(spark_class()).parent.parent)
    os.environ.setdefault("SPARK_LOCAL_IP", host)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_NO_DAEMONIZE", "1")
    os.environ.setdefault("SPARK_WORKER_DIR", "/tmp/spark-work")


def spark_command(role: str, env: Mapping[str, str], host: str) -> list[str]:
    """The spark-class command line of the spark-master or spark-worker role."""
    port = int(env.get("LEDGERMQ_SPARK_PORT", DEFAULT_SPARK_PORT))
    if role == "spark-master":
        return [spark_class(), "org.apache.spark.deploy.master.Master", "--host", host,
                "--port", str(port), "--webui-port", env.get("LEDGERMQ_SPARK_UI_PORT", "8080")]
    master = env.get("LEDGERMQ_SPARK_MASTER", "")
    if not master.startswith("spark://"):
        raise ConfigError(f"LEDGERMQ_SPARK_MASTER={master!r}: set the master's URL, "
                          "spark://HOST:PORT")
    priority = env.get("LEDGERMQ_SPARK_PRIORITY", "idle")
    if priority not in ("idle", "normal"):
        raise ConfigError(f"LEDGERMQ_SPARK_PRIORITY={priority!r}: idle or normal")
    return [*(IDLE_PRIORITY if priority == "idle" else []), spark_class(),
            "org.apache.spark.deploy.worker.Worker", "--host", host,
            "--cores", env.get("LEDGERMQ_SPARK_WORKER_CORES", "1"),
            "--memory", env.get("LEDGERMQ_SPARK_WORKER_MEMORY", "1g"),
            "--work-dir", os.environ.get("SPARK_WORKER_DIR", "/tmp/spark-work"),
            "--webui-port", env.get("LEDGERMQ_SPARK_UI_PORT", "8081"), master]


def audit_environment(env: Mapping[str, str]) -> dict[str, str]:
    """Defaults of `ledgermq audit schedule` in a container: the state
    volume, the replica tree as the group specs, the administrator's
    credentials from the shared secrets (unless running open)."""
    out = {"LEDGERMQ_AUDIT_STATE": env.get("LEDGERMQ_AUDIT_STATE", DEFAULT_AUDIT_STATE),
           "LEDGERMQ_AUDIT_SPECS": env.get("LEDGERMQ_AUDIT_SPECS")
           or env.get("LEDGERMQ_AUDIT_REPLICAS", DEFAULT_AUDIT_REPLICAS)}
    files = secret_files(env)
    if files is not None and not env.get("LEDGERMQ_ACCESS_KEY"):
        out["LEDGERMQ_ACCESS_KEY"] = env.get("LEDGERMQ_ADMIN_ACCESS_KEY", ADMIN_ACCESS_KEY)
        out["LEDGERMQ_SECRET_FILE"] = files[1]
    return out


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
        try:
            files = prepare_secrets(env)
        except OSError as exc:
            print(f"ledgermq-entrypoint: cannot prepare the secrets: {exc}", file=sys.stderr)
            return 2
        if files is not None:
            # The NameServer reads these variables (explicit options win).
            os.environ.setdefault("LEDGERMQ_CLUSTER_SECRET_FILE", files[0])
            os.environ.setdefault("LEDGERMQ_NAMESRV_ADMIN_SECRET_FILE", files[1])
            if env.get("LEDGERMQ_ADMIN_ACCESS_KEY"):
                os.environ.setdefault("LEDGERMQ_NAMESRV_ADMIN_ACCESS_KEY",
                                      env["LEDGERMQ_ADMIN_ACCESS_KEY"])
        HEALTH_FILE.write_text("\n".join(_health_lines(
            "127.0.0.1:" + listen.rsplit(":", 1)[1],
            os.environ.get("LEDGERMQ_CLUSTER_SECRET_FILE", ""),
            os.environ.get("LEDGERMQ_NAMESRV_TLS_CA_FILE", "")
            if os.environ.get("LEDGERMQ_NAMESRV_TLS_CERT_FILE") else "")))
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
                try:
                    prepare_secrets(env)
                except OSError as exc:
                    print(f"ledgermq-entrypoint: cannot prepare the secrets: {exc}",
                          file=sys.stderr)
                    return 2
                config = str(Path(env.get("LEDGERMQ_RENDERED_CONFIG", "/tmp/broker.toml")))
                Path(config).write_text(text)
                print(f"ledgermq-entrypoint: rendered {config} from the environment:\n{text}",
                      flush=True)
            args = ["--config", config, *args]
        HEALTH_FILE.write_text("\n".join(_health_from_config(config)))
        _exec([_ledgermq(), "broker", *args])
    if role in ("spark-master", "spark-worker", "audit-schedule"):
        try:
            host = env.get("LEDGERMQ_SPARK_HOST") or container_address()
            spark_env(env, host)
            if role != "spark-master":
                links = link_replicas(env.get("LEDGERMQ_AUDIT_MOUNTS", DEFAULT_AUDIT_MOUNTS),
                                      env.get("LEDGERMQ_AUDIT_REPLICAS", DEFAULT_AUDIT_REPLICAS))
                print(f"ledgermq-entrypoint: replicas {' '.join(links) or 'none mounted'}",
                      flush=True)
            if role == "audit-schedule":
                os.environ.update(audit_environment(env))
                HEALTH_FILE.write_text("process")
                _exec([_ledgermq(), "audit", "schedule", *args])
            # Healthy when the daemon accepts connections: the master's port,
            # the worker's web UI (a worker has no other port of its own).
            port = (env.get("LEDGERMQ_SPARK_PORT", str(DEFAULT_SPARK_PORT))
                    if role == "spark-master" else env.get("LEDGERMQ_SPARK_UI_PORT", "8081"))
            HEALTH_FILE.write_text(f"tcp:{host}:{port}")
            _exec([*spark_command(role, env, host), *args])
        except (ConfigError, ValueError, OSError) as exc:
            print(f"ledgermq-entrypoint: {exc}", file=sys.stderr)
            return 2
    if role == "health":
        options = HEALTH_FILE.read_text().split("\n") if HEALTH_FILE.exists() else []
        if not options or not options[0]:
            print("ledgermq-entrypoint: no role has started yet", file=sys.stderr)
            return 1
        if options[0] == "process":  # a role with no port: PID 1 runs, that is all
            return 0
        if options[0].startswith("tcp:"):  # a port that speaks no LedgerMQ: it accepts
            import socket

            host, port = options[0][4:].rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=3).close()
            except OSError as exc:
                print(f"ledgermq-entrypoint: {host}:{port}: {exc}", file=sys.stderr)
                return 1
            return 0
        # The environment's credentials are not the health check's to use.
        for name in ("LEDGERMQ_ACCESS_KEY", "LEDGERMQ_SECRET_FILE", "LEDGERMQ_TLS_CA_FILE"):
            os.environ.pop(name, None)
        _exec([_ledgermq(), "ping", *options, "--timeout", "3"])
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
