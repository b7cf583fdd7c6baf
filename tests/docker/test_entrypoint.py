"""The image's entry point renders a broker config from LEDGERMQ_* variables,
with authentication on, and generates the shared secrets safely.

Runs on the host against docker/entrypoint.py itself; the rendered text must
load with the broker's own config parser, so the variables documented in
docs/deploy.md cannot drift from what a broker accepts.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ledgermq.broker.config import parse_config
from ledgermq.wire.auth import read_secret_file

SPEC = importlib.util.spec_from_file_location(
    "ledgermq_entrypoint", Path(__file__).resolve().parents[2] / "docker" / "entrypoint.py")
assert SPEC is not None and SPEC.loader is not None
entrypoint = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(entrypoint)

BASE = {"LEDGERMQ_GROUP": "broker-a", "LEDGERMQ_NODE_ID": "2",
        "LEDGERMQ_PEERS": "1=10.0.0.11, 2=10.0.0.12:10912, 3=host-c:10913:20913",
        "LEDGERMQ_NAMESRV": "10.0.0.2:9876,10.0.0.3:9876"}


def render(**extra: str) -> dict:
    return tomllib.loads(entrypoint.render_broker_config({**BASE, **extra}))


def test_rendered_config_is_what_the_broker_parses() -> None:
    raw = render(LEDGERMQ_FLUSH="sync", LEDGERMQ_REPLICATE="async",
                 LEDGERMQ_RAFT_TICK_MS="40", LEDGERMQ_CONF_SEGMENT_SIZE_BYTES="4194304",
                 LEDGERMQ_CONF_AUTO_CREATE_TOPICS="false", LEDGERMQ_RAFT_PORT="20911")
    config = parse_config(raw)
    assert (config.group, config.node_id, config.flush, config.replicate) == \
        ("broker-a", 2, "sync", "async")
    assert config.peers[1].raft == "10.0.0.11:20911"
    assert config.peers[1].client == "10.0.0.11:10911"
    assert config.peers[2].client == "10.0.0.12:10912"
    assert config.peers[3].raft == "host-c:20913"
    assert config.namesrv == ("10.0.0.2:9876", "10.0.0.3:9876")
    assert config.tick_ms == 40 and config.segment_size_bytes == 4194304
    assert config.auto_create_topics is False
    # Bound to every interface on the node's own client port; advertised as in peers.
    assert config.listen == "0.0.0.0:10912" and config.raft_bind_host == "0.0.0.0"
    assert config.data_dir == "/var/lib/ledgermq/data"


@pytest.mark.parametrize(("env", "message"), [
    ({"LEDGERMQ_GROUP": ""}, "LEDGERMQ_GROUP"),
    ({"LEDGERMQ_NODE_ID": "4"}, "not an id"),
    ({"LEDGERMQ_PEERS": "1=a:b"}, "expected ID=HOST"),
    ({"LEDGERMQ_PEERS": "x=10.0.0.1"}, "expected ID=HOST"),
])
def test_bad_environment_is_refused_with_the_variable_named(env: dict, message: str) -> None:
    with pytest.raises(entrypoint.ConfigError, match=message):
        entrypoint.render_broker_config({**BASE, **env})


def test_unknown_key_reaches_the_broker_validation() -> None:
    from ledgermq.broker.config import BrokerConfigError

    with pytest.raises(BrokerConfigError, match="no_such_key"):
        parse_config(render(LEDGERMQ_CONF_NO_SUCH_KEY="1"))


def test_rendered_config_has_authentication_on_by_default(tmp_path: Path) -> None:
    """Containers listen on 0.0.0.0: without the secrets the broker would
    refuse to start; with the ones the entry point generates it starts secured."""
    from ledgermq.broker.keys import BrokerSecurity

    env = {**BASE, "LEDGERMQ_SECRETS_DIR": str(tmp_path / "secrets")}
    config = parse_config(render(LEDGERMQ_SECRETS_DIR=str(tmp_path / "secrets")))
    assert config.cluster_secret_file == str(tmp_path / "secrets" / "cluster.secret")
    assert config.admin_secret_file == str(tmp_path / "secrets" / "admin.secret")
    assert config.allow_open is False
    assert entrypoint.prepare_secrets(env) == (config.cluster_secret_file,
                                               config.admin_secret_file)
    security = BrokerSecurity.load(config)
    assert security.keys is not None and security.keys.admin_secret is not None
    # Told to run open: no secrets, and allow_open so that 0.0.0.0 is accepted.
    opened = parse_config(render(LEDGERMQ_ALLOW_OPEN="true"))
    assert opened.allow_open is True and not opened.cluster_secret_file
    assert BrokerSecurity.load(opened).keys is None
    assert entrypoint.prepare_secrets({**env, "LEDGERMQ_ALLOW_OPEN": "1"}) is None


def _race(path: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    created = entrypoint.ensure_secret(path)
    out.put((created, Path(path).read_bytes()))


def test_containers_starting_together_share_one_complete_secret(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "shared" / "cluster.secret")
    racers = 8
    barrier, out = ctx.Barrier(racers), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(path, barrier, out)) for _ in range(racers)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert sum(created for created, _ in results) == 1
    secrets_seen = {secret for _, secret in results}
    assert len(secrets_seen) == 1 and len(secrets_seen.pop().strip()) == 64
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path / "shared") == ["cluster.secret"]  # no temporary left
    assert read_secret_file(path)
    # A later start keeps it.
    before = Path(path).read_bytes()
    assert entrypoint.ensure_secret(path) is False and Path(path).read_bytes() == before


def test_health_check_pings_with_the_cluster_key(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(entrypoint.render_broker_config(
        {**BASE, "LEDGERMQ_SECRETS_DIR": "/s"}))
    assert entrypoint._health_from_config(str(config)) == [
        "127.0.0.1:10912", "--access-key", "cluster", "--secret-file", "/s/cluster.secret"]
    config.write_text(entrypoint.render_broker_config({**BASE, "LEDGERMQ_ALLOW_OPEN": "yes"}))
    assert entrypoint._health_from_config(str(config)) == ["127.0.0.1:10912"]


def test_replica_tree_names_replicas_after_their_brokers(tmp_path: Path) -> None:
    """The audit and Spark roles see /replicas/<group>/<node>/data as
    <tree>/<group>/<node>: the audit finds the group there, replicas named
    after the nodes (not `data`, `data`, `data`)."""
    from spark_audit.inputs import parse_group_specs

    mounts, tree = tmp_path / "replicas", tmp_path / "tree"
    for node in ("broker-a-1", "broker-a-2", "broker-a-3"):
        (mounts / "broker-a" / node / "data" / "commitlog").mkdir(parents=True)
    (mounts / "broker-b" / "broker-b-1").mkdir(parents=True)  # its broker wrote nothing yet
    made = entrypoint.link_replicas(str(mounts), str(tree))
    assert len(made) == 4
    assert entrypoint.link_replicas(str(mounts), str(tree)) == made  # a restart: same links
    replicas = parse_group_specs([str(tree)])
    assert {(r.group, r.name) for r in replicas} == {
        ("broker-a", "broker-a-1"), ("broker-a", "broker-a-2"), ("broker-a", "broker-a-3")}
    assert entrypoint.link_replicas(str(tmp_path / "none"), str(tree)) == []


def test_audit_schedule_environment(tmp_path: Path) -> None:
    env = {"LEDGERMQ_SECRETS_DIR": "/s"}
    assert entrypoint.audit_environment(env) == {
        "LEDGERMQ_AUDIT_STATE": "/var/lib/ledgermq-audit",
        "LEDGERMQ_AUDIT_SPECS": "/tmp/ledgermq-replicas",
        "LEDGERMQ_ACCESS_KEY": "admin", "LEDGERMQ_SECRET_FILE": "/s/admin.secret"}
    opened = entrypoint.audit_environment({"LEDGERMQ_ALLOW_OPEN": "true",
                                           "LEDGERMQ_AUDIT_SPECS": "g=/a,/b"})
    assert opened["LEDGERMQ_AUDIT_SPECS"] == "g=/a,/b" and "LEDGERMQ_ACCESS_KEY" not in opened


def test_spark_commands() -> None:
    master = entrypoint.spark_command("spark-master", {}, "10.0.0.20")
    assert master[0].endswith("/bin/spark-class") and Path(master[0]).exists()
    assert master[1:] == ["org.apache.spark.deploy.master.Master", "--host", "10.0.0.20",
                          "--port", "7077", "--webui-port", "8080"]
    worker = entrypoint.spark_command("spark-worker", {
        "LEDGERMQ_SPARK_MASTER": "spark://10.0.0.20:7077", "LEDGERMQ_SPARK_WORKER_CORES": "2"},
        "10.0.0.21")
    assert worker[:9] == entrypoint.IDLE_PRIORITY  # the worker and its executors: idle
    assert worker[10:] == ["org.apache.spark.deploy.worker.Worker", "--host", "10.0.0.21",
                           "--cores", "2", "--memory", "1g", "--work-dir", "/tmp/spark-work",
                           "--webui-port", "8081", "spark://10.0.0.20:7077"]
    normal = entrypoint.spark_command("spark-worker", {
        "LEDGERMQ_SPARK_MASTER": "spark://m:7077", "LEDGERMQ_SPARK_PRIORITY": "normal"}, "h")
    assert normal[0].endswith("spark-class")
    with pytest.raises(entrypoint.ConfigError, match="LEDGERMQ_SPARK_MASTER=''"):
        entrypoint.spark_command("spark-worker", {}, "h")
    with pytest.raises(entrypoint.ConfigError, match="LEDGERMQ_SPARK_PRIORITY='high'"):
        entrypoint.spark_command("spark-worker", {"LEDGERMQ_SPARK_MASTER": "spark://m:1",
                                                  "LEDGERMQ_SPARK_PRIORITY": "high"}, "h")


def test_health_of_a_port_and_of_a_process(tmp_path: Path, monkeypatch: Any) -> None:
    import socket

    health = tmp_path / "health"
    monkeypatch.setattr(entrypoint, "HEALTH_FILE", health)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        health.write_text(f"tcp:127.0.0.1:{port}")
        assert entrypoint.main(["health"]) == 0
    assert entrypoint.main(["health"]) == 1  # closed now
    health.write_text("process")
    assert entrypoint.main(["health"]) == 0
