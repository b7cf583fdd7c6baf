"""One `docker-compose -p <project> -f docker/compose.yml` project for a test.

The compose file runs exactly as a user would run it; a test changes only its
variables: a free /24 (`LEDGERMQ_NET`), free host ports for the published
NameServer and its admin app, a project name of its own, the images. The
`audit` profile (spark-master, spark-worker, audit) is started only by the
tests that ask for it. `teardown` removes the project's containers, network
and volumes whatever happened, and checks that nothing is left.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path

from chaos.docker_backend import container_ids, free_prefix
from ledgermq.wire.auth import Credentials, read_secret_file

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yml"
SECRETS = "/var/lib/ledgermq-secrets"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Deployment:
    """One compose project; `env` holds its variables (add to it before `up`)."""

    def __init__(self, image: str, name: str = "lmqtest", audit_image: str = "") -> None:
        self.project = f"{name}{os.getpid()}"
        self.net = free_prefix(random.Random())
        self.namesrv_port = free_port()
        self.admin_port = free_port()
        self.env = {**os.environ, "LEDGERMQ_IMAGE": image, "LEDGERMQ_NET": self.net,
                    "LEDGERMQ_NAMESRV_PORT": str(self.namesrv_port),
                    "LEDGERMQ_ADMIN_PORT": str(self.admin_port)}
        if audit_image:
            self.env["LEDGERMQ_AUDIT_IMAGE"] = audit_image

    def compose(self, *args: str, check: bool = True, profile: str = "",
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker-compose", "-p", self.project, "-f", str(COMPOSE),
                                 *(["--profile", profile] if profile else []), *args],
                                env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: {result.stderr[-2000:]}")
        return result

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service, profile="audit").stdout.strip()

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def admin_url(self) -> str:
        """The NameServer's admin app (API, dashboard), published on loopback."""
        return f"http://127.0.0.1:{self.admin_port}"

    def brokers(self) -> dict[int, str]:
        return {n: f"{self.net}.{10 + n}:10911" for n in (1, 2, 3)}

    def secret(self, service: str, name: str) -> bytes:
        """A secret file of the shared volume, as seen in `service`'s container."""
        out = subprocess.run(["docker", "exec", self.container(service), "cat",
                              f"{SECRETS}/{name}"], capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def admin_credentials(self, tmp_path: Path) -> Credentials:
        """What a user does (docker/compose.yml's header): copy admin.secret
        out with mode 0600 and sign in as `admin` with it."""
        path = tmp_path / "admin.secret"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(self.secret("namesrv", "admin.secret"))
        return Credentials("admin", read_secret_file(path))

    def teardown(self) -> None:
        """`down -v` of every service (the audit profile's too); AssertionError
        when a container or a volume of the project is left."""
        logs = self.compose("logs", "--no-color", "--tail", "40", check=False,
                            profile="audit").stdout
        down = self.compose("down", "-v", "--remove-orphans", check=False, profile="audit")
        left = container_ids(self.project)
        volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter",
                                  f"label=com.docker.compose.project={self.project}"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
        assert down.returncode == 0 and not left and not volumes, (down.stderr, left, logs)
