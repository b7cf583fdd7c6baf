"""`ledgermq chaos` against a compose deployment: the docker backend.

A short run with a partition nemesis and a leader kill on three containers,
with authentication and TLS on every port, must pass the history checker;
the data directories copied out of the containers must pass the replica
audit (the in-process engine here, to keep
the tier short: the Spark engine reads the same files and is run by hand,
docs/deploy.md); and nothing of the run's compose project may remain.
Injections the kernel cannot do (delay without netem) must be refused at
start, not faked.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys

import pytest

from chaos.backend import CannotInject, ClusterSpec
from chaos.docker_backend import DockerBackend, container_ids
from chaos.runner import RunConfig, run
from chaos.schedule import Schedule

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_secured_partition_and_kill_run_passes_checker_and_audit(ledgermq_image: str,
                                                                 tmp_path) -> None:
    """The run's secrets and certificate are mounted into the containers and the
    workload runs as an ACL user (chaos.security); the unsecured docker run is
    the same code without them (and a chaos matrix cell on the netns backend)."""
    out = tmp_path / "run"
    config = RunConfig(out=out, nemesis="partition-halves,kill-leader", time_limit=20, rate=30,
                       seed=11, schedule=Schedule("fixed", 6, 4), backend="docker",
                       producers=2, consumers=2, log_level="WARNING", secure=True)
    lines: list[str] = []
    results = run(config, log=lines.append)
    check = results["checker"]
    assert results["valid"], json.dumps({k: check[k] for k in ("counts", "examples")})[:3000]
    first_failure = next((line for line in (out / "history.jsonl").read_text().splitlines()
                          if '"fail"' in line), None)
    assert check["sends"]["acknowledged"] > 100, (check["sends"], first_failure, lines[-10:])
    for kind in ("lost", "unexpected", "inconsistent_offsets", "phantom"):
        assert check["counts"][kind] == 0
    assert results["availability"]["per_fault"], "the nemesis never struck"
    assert results["capabilities"]["partition"] is None
    assert results["capabilities"]["kill"] is None
    security = results["phases"]["security"]
    assert security["auth"] and security["tls"]
    assert security["workload_user"]["topics"] == {"chaos": "PUB|SUB"}
    compose = json.loads((out / "compose.json").read_text())
    node = compose["services"]["n1"]
    assert node["environment"]["LEDGERMQ_CONF_CLUSTER_SECRET_FILE"].startswith(
        "/etc/ledgermq/security/")
    assert "--tls-cert-file" in compose["services"]["namesrv"]["command"]

    data = out / "data" / "chaos"
    assert sorted(p.name for p in data.iterdir()) == ["n1", "n2", "n3"]
    assert any((data / "n1").rglob("*.durable")), "durability trace missing in containers"
    assert (out / "logs" / "n1.log").read_text().count("broker listening on") >= 1
    project = next(line.split()[3] for line in lines if "docker project" in line)
    assert container_ids(project) == []

    audit = subprocess.run([sys.executable, "-m", "ledgermq.cli", "audit", str(data),
                            "--history", str(out / "history.jsonl"), "--engine", "python",
                            "--out", str(tmp_path / "audit")],
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]


def test_backend_partitions_inside_containers_and_refuses_what_it_cannot(
        ledgermq_image: str, tmp_path) -> None:
    backend = DockerBackend(ClusterSpec(nodes=3, log_level="WARNING"), tmp_path / "b",
                            log=lambda _m: None, seed=random.randrange(1000))
    with backend:
        caps = backend.capabilities()
        assert caps["clock"] is not None
        if caps["delay"] is not None:  # this kernel: no netem, so shaping must be refused
            with pytest.raises(CannotInject, match="delay"):
                backend.shape(1, 2, 50.0)
        backend.drop(1, 2)
        backend.drop(3, 2, probability=0.5)
        rules = backend.rules(2)
        assert f"-s {backend.node_ip(1)}/32 -j DROP" in rules
        assert "statistic" in rules
        # A killed and restarted node gets its partition back in its new namespace.
        backend.signal_node(2, signal.SIGKILL)
        assert backend.wait_node_exit(2, 30.0)
        backend.start_node(2)
        assert backend.wait_node_ready(2, 90.0)
        assert f"-s {backend.node_ip(1)}/32 -j DROP" in backend.rules(2)
        backend.heal()
        assert "DROP" not in backend.rules(2)
        project = backend.project
    assert container_ids(project) == []
    assert sorted(p.name for p in (tmp_path / "b" / "data" / "chaos").iterdir()) == \
        ["n1", "n2", "n3"]
