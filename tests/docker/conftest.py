"""Fixtures for the docker tier: the LedgerMQ images, each built once per session.

The image is built by docker/build-image.sh, the same script an air-gapped
site uses: a debootstrap'd Debian base (made once, then reused by tag) and
the project installed on it with host networking for pip. Docker's layer
cache makes the build a few seconds when the sources did not change. The
audit image (`build-image.sh --audit`: Java and PySpark on the same base) is
built only by the tests that start the audit services; its Java and Spark
layer is cached apart from the sources, so a source change costs seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.docker_backend import docker_available
from tests.support import is_root, require

REPO = Path(__file__).resolve().parents[2]
# LEDGERMQ_IMAGE: another tag, so that runs from different checkouts on one
# docker host do not rebuild each other's image (the chaos backend reads it too).
IMAGE = os.environ.get("LEDGERMQ_IMAGE", "ledgermq:latest")
AUDIT_IMAGE = os.environ.get("LEDGERMQ_AUDIT_IMAGE", "ledgermq-audit:latest")
# The largest deployment a docker test starts: a NameServer and three nodes
# of the image, and the audit profile's three containers of the audit image.
CONTAINERS_MAX = 4
AUDIT_CONTAINERS = 3


def docker_disk_shortfall(image: str, containers: int) -> str | None:
    """Why the docker root cannot hold `containers` of `image`, or None.

    With the vfs storage driver every container is two full copies of the
    image (its init layer and its writable layer); with overlay2 they share
    the image's layers. A nearly full disk shows up as "no space left on
    device" half way through `compose up`, so it is checked once, before any
    test starts a container, to fail with the figures instead.
    """
    info = subprocess.run(["docker", "info", "-f", "{{.DockerRootDir}} {{.Driver}}"],
                          capture_output=True, text=True, check=True).stdout.split()
    root, driver = info[0], info[1]
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image],
                              capture_output=True, text=True, check=True).stdout)
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    copies = 2 * containers if driver == "vfs" else 0
    needed = copies * size + (1 << 30)  # and 1 GiB for volumes, logs, writable layers
    if free >= needed:
        return None
    return (f"{root} has {free / 2**30:.1f} GiB free; {containers} containers of {image} "
            f"({size / 2**20:.0f} MiB, storage driver {driver}) need {needed / 2**30:.1f} GiB")


def needs_docker() -> None:
    reason = docker_available()
    require(reason is None, f"docker tier: {reason}")
    require(is_root(), "docker tier: the image build (debootstrap) and volume access need root")


def build(image: str, *options: str) -> None:
    """docker/build-image.sh [options] image, or the test fails with its output."""
    started = time.monotonic()
    result = subprocess.run([str(REPO / "docker" / "build-image.sh"), *options, image],
                            cwd=REPO, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        pytest.fail(f"docker/build-image.sh {' '.join(options)} failed:\n"
                    f"{result.stderr[-4000:]}", pytrace=False)
    print(f"\nimage {image} ready in {time.monotonic() - started:.0f} s", file=sys.stderr)


@pytest.fixture(scope="session")
def ledgermq_image() -> str:
    needs_docker()
    build(IMAGE)
    shortfall = docker_disk_shortfall(IMAGE, CONTAINERS_MAX)
    if shortfall:
        pytest.fail(f"docker tier: not enough disk: {shortfall}", pytrace=False)
    return IMAGE


@pytest.fixture(scope="session")
def audit_image(ledgermq_image: str) -> str:
    """The image of the spark-master, spark-worker and audit services."""
    build(AUDIT_IMAGE, "--audit")
    shortfall = docker_disk_shortfall(AUDIT_IMAGE, AUDIT_CONTAINERS)
    if shortfall:
        pytest.fail(f"docker tier: not enough disk: {shortfall}", pytrace=False)
    return AUDIT_IMAGE
