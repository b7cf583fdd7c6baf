"""Secure by default on the newcomer path: `ledgermq dev` starts with
authentication on (secrets generated once, 0600, reused), prints the exports
README's "Playing by hand" shows, refuses clients without credentials and
serves the ones it printed; `--open` is for loopback only; `ledgermq ping`
authenticates and speaks TLS; `LocalCluster(secure=True)` underneath."""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledgermq.base import loop
from ledgermq.base.ports import free_port
from ledgermq.broker.launcher import REPO, LocalCluster, wait_leader
from ledgermq.wire.auth import write_secret_file
from tests.ledgermq.broker.test_cli import wait_gone
from tests.ledgermq.cli.conftest import ledgermq
from tests.ledgermq.cli.test_newcomer import playing_by_hand

pytestmark = [pytest.mark.timeout(240)]

ROW_PID = re.compile(r"(?:namesrv|broker n\d[^│]*)\s*│\s*(\d+)")


class Dev:
    """One `ledgermq dev` child: its output so far and the PIDs it printed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.ready = threading.Event()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def pids(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := ROW_PID.search(line))]

    def exports(self) -> dict[str, str]:
        """The `export NAME=VALUE` lines it printed, as the shell would read them."""
        return dict(shlex.split(line)[1].split("=", 1) for line in self.lines
                    if line.startswith("export "))


@contextmanager
def dev(cwd: Path, *args: str) -> Iterator[Dev]:
    """`ledgermq dev ARGS` in `cwd` until the block ends (SIGINT, then its
    children must be gone); yields once it is up, or at once if it exited."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    env.pop("LEDGERMQ_ACCESS_KEY", None)
    env.pop("LEDGERMQ_SECRET_FILE", None)
    proc = subprocess.Popen([sys.executable, "-m", "ledgermq.cli", "dev", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cwd)
    run = Dev(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            run.lines.append(line)
            if "Ctrl-C stops everything" in line:
                run.ready.set()
        run.ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert run.ready.wait(90), run.text
        yield run
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)
        wait_gone(run.pids())


def addresses() -> list[str]:
    return ["--namesrv", f"127.0.0.1:{free_port()}", "--admin", f"127.0.0.1:{free_port()}",
            "--nodes", "1"]


def with_env(exports: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`ledgermq ARGS` with the printed variables exported, as a user would."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200", **exports)
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)


@pytest.mark.slow
def test_dev_is_secured_with_generated_secrets_it_prints_and_reuses(tmp_path: Path) -> None:
    flags = addresses()
    namesrv = flags[1]
    secrets_dir = tmp_path / "ledgermq-dev" / "secrets"  # the default --dir, as in README
    with dev(tmp_path, *flags) as run:
        assert run.proc.poll() is None, run.text
        assert "Authentication is on" in run.text and "generated now" in run.text
        exports = run.exports()
        assert exports == {"LEDGERMQ_ACCESS_KEY": "admin",
                           "LEDGERMQ_SECRET_FILE": str(secrets_dir / "admin.secret")}
        # README's "Playing by hand" exports the same two lines (relative to
        # the directory `ledgermq dev` ran in).
        readme = {w[1].split("=", 1)[0]: w[1].split("=", 1)[1] for w in playing_by_hand()
                  if w[0] == "export"}
        assert readme == {"LEDGERMQ_ACCESS_KEY": "admin",
                          "LEDGERMQ_SECRET_FILE": "$PWD/ledgermq-dev/secrets/admin.secret"}
        assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
        first = {}
        for name in ("cluster.secret", "admin.secret"):
            assert stat.S_IMODE((secrets_dir / name).stat().st_mode) == 0o600, name
            first[name] = (secrets_dir / name).read_bytes()
        assert first["cluster.secret"] != first["admin.secret"]

        # Without credentials: refused by the brokers, with the reason.
        refused = ledgermq("send", "secured", "nope", "--namesrv", namesrv)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused
        # With the printed ones: send, consume, and a ping that checks the proofs.
        sent = with_env(exports, "send", "secured", "one", "two", "--namesrv", namesrv)
        assert sent.returncode == 0, sent.stderr
        got = with_env(exports, "consume", "secured", "--group", "g", "--count", "2",
                       "--namesrv", namesrv)
        assert got.returncode == 0 and {"one", "two"} <= set(got.stdout.split()), got
        status = with_env(exports, "status", "--namesrv", namesrv)
        assert status.returncode == 0 and "leader" in status.stdout, status.stderr
        broker = re.search(r"broker n1[^│]*│[^│]*│\s*(\S+)", run.text)
        assert broker, run.text
        pinged = with_env(exports, "ping", broker.group(1))
        assert pinged.returncode == 0 and "ok as admin" in pinged.stdout, pinged

    # A second start on the same directory reuses the secrets: the same
    # credentials still work.
    with dev(tmp_path, *flags) as run:
        assert "reused" in run.text and run.exports() == exports, run.text
        for name, value in first.items():
            assert (secrets_dir / name).read_bytes() == value
        sent = with_env(exports, "send", "secured", "three", "--namesrv", namesrv)
        assert sent.returncode == 0, sent.stderr

    # A secret others may read is refused before anything starts.
    (secrets_dir / "admin.secret").chmod(0o644)
    with dev(tmp_path, *flags) as run:
        assert run.proc.wait(30) == 2, run.text
        assert "chmod 600" in run.text and not run.pids()


@pytest.mark.slow
def test_dev_open_runs_without_secrets_on_loopback_only(tmp_path: Path) -> None:
    with dev(tmp_path, "--open", "--namesrv", "0.0.0.0:0") as run:
        assert run.proc.wait(30) == 2
        assert "loopback" in run.text and "0.0.0.0:0" in run.text and not run.pids()
    flags = addresses()
    with dev(tmp_path, "--open", *flags) as run:
        assert run.proc.poll() is None, run.text
        assert "Authentication is off" in run.text and not run.exports()
        assert not (tmp_path / "ledgermq-dev" / "secrets").exists()
        sent = ledgermq("send", "open", "anyone", "--namesrv", flags[1])
        assert sent.returncode == 0, sent.stderr


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """A secured one-node LocalCluster whose client ports serve TLS."""
    import trustme

    base = tmp_path_factory.mktemp("ping")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(base / "node.pem"))
    cert.private_key_pem.write_to_path(str(base / "node.key"))
    settings = {"tls_cert_file": str(base / "node.pem"), "tls_key_file": str(base / "node.key"),
                "tls_ca_file": str(base / "ca.pem")}
    with LocalCluster(base / "cluster", nodes=1, settings=settings, secure=True) as cluster:
        loop.run(wait_leader(cluster))
        yield cluster, base / "ca.pem"


@pytest.mark.slow
def test_local_cluster_secure_generates_its_secrets(
        tls_cluster: tuple[LocalCluster, Path]) -> None:
    cluster, _ = tls_cluster
    cluster_file, admin_file = cluster.secret_paths
    assert cluster.generated == [cluster_file, admin_file]
    assert cluster.settings["cluster_secret_file"] == str(cluster_file)
    assert cluster.admin_credentials.access_key == "admin"
    assert cluster.admin_credentials.secret == admin_file.read_bytes().strip()
    for path in (cluster_file, admin_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.slow
def test_ping_authenticates_over_tls(tls_cluster: tuple[LocalCluster, Path],
                                     tmp_path: Path) -> None:
    cluster, ca = tls_cluster
    broker = cluster.client_address(1)
    _, admin_file = cluster.secret_paths
    tls = ["--tls-ca-file", str(ca)]
    ok = ledgermq("ping", broker, *tls, "--access-key", "admin", "--secret-file",
                  str(admin_file))
    assert ok.returncode == 0 and "ok as admin" in ok.stdout, ok
    # PING needs no credentials (a liveness check), but TLS it does need.
    assert ledgermq("ping", broker, *tls).returncode == 0
    plain = ledgermq("ping", broker, "--timeout", "2")
    assert plain.returncode == 1 and f"ping {broker}" in plain.stderr, plain
    # The cluster key works on the NameServer too (the container health check).
    cluster_file, _ = cluster.secret_paths
    ns = ledgermq("ping", cluster.namesrv_address, *tls, "--access-key", "cluster",
                  "--secret-file", str(cluster_file))
    assert ns.returncode == 0 and "ok as cluster" in ns.stdout, ns
    # A wrong secret is refused; half a pair or a readable file is a usage error.
    write_secret_file(tmp_path / "wrong.secret")
    wrong = ledgermq("ping", broker, *tls, "--access-key", "admin", "--secret-file",
                     str(tmp_path / "wrong.secret"))
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr, wrong
    half = ledgermq("ping", broker, "--access-key", "admin")
    assert half.returncode == 1 and "go together" in half.stderr, half
    (tmp_path / "wrong.secret").chmod(0o640)
    readable = ledgermq("ping", broker, "--access-key", "admin", "--secret-file",
                        str(tmp_path / "wrong.secret"))
    assert readable.returncode == 1 and "chmod 600" in readable.stderr, readable
