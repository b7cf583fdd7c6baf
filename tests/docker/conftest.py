"""Fixtures for the docker tier: the LedgerMQ images, each built once per session.

The image is built by docker/build-image.sh, the same script an air-gapped
site uses: a debootstrap'd Debian base (made once, then reused by tag) and
the project installed on it with host networking for pip. Docker's layer
cache makes the build a few seconds when the sources did not change. The
audit image (`build-image.sh --audit`: Java and PySpark on the same base) is
built only by the tests that start the audit services; its Java and Spark
layer is cached apart from the sources, so a source change costs seconds.

On a fresh machine (every CI run) those builds take minutes, mostly
downloads and unpacking. So once collection shows that docker tests will
run, the builds start in the background (`pytest_collection_finish`, at
nice 19 and the idle I/O class) while the tiers before run; the fixtures
wait for that build, then run their own, which the layer cache makes a
matter of seconds (and which reports any failure, as before). Under
pytest-xdist only the first worker starts that build; a fixture on another
worker waits for it through build-image.sh's host-wide lock.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
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


# The background build started at collection (None: none, or already waited for).
_prebuild: subprocess.Popen[bytes] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the images the collected docker tests need, in the
    background (see the module's docstring)."""
    global _prebuild
    needs = {name for item in session.items for name in getattr(item, "fixturenames", ())
             if name in ("ledgermq_image", "audit_image")}
    first_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    if session.config.option.collectonly or not needs or not first_worker or not is_root() \
            or docker_available() is not None:
        return  # nothing to build, or the fixtures will say why they cannot
    script = REPO / "docker" / "build-image.sh"
    steps = [shlex.join([str(script), IMAGE])]
    if "audit_image" in needs:
        steps.append(shlex.join([str(script), "--audit", AUDIT_IMAGE]))
    # Its output is read only if it fails: the fixture's own build then says why.
    with open(os.path.join(tempfile.gettempdir(), "ledgermq-docker-prebuild.log"), "wb") as log:
        _prebuild = subprocess.Popen(
            ["nice", "-n", "19", "ionice", "-c", "3", "bash", "-c", " && ".join(steps)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that ends before its docker tests (-x, Ctrl-C) stops the build."""
    global _prebuild
    if _prebuild is not None and _prebuild.poll() is None:
        # SIGTERM first: the script's traps remove a half-made base tree.
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(_prebuild.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                _prebuild.wait(timeout=grace)
                break
    _prebuild = None


def _wait_prebuild() -> None:
    global _prebuild
    if _prebuild is not None:
        started = time.monotonic()
        _prebuild.wait(timeout=1800)
        print(f"\nbackground image build done (waited {time.monotonic() - started:.0f} s, "
              f"exit {_prebuild.returncode})", file=sys.stderr)
        _prebuild = None


def build(image: str, *options: str) -> None:
    """docker/build-image.sh [options] image, or the test fails with its output."""
    _wait_prebuild()
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
