"""Fixtures for the docker tier: the LedgerMQ image, built once per session.

The image is built by docker/build-image.sh, the same script an air-gapped
site uses: a debootstrap'd Debian base (made once, then reused by tag) and
the project installed on it with host networking for pip. Docker's layer
cache makes the build a few seconds when the sources did not change.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.docker_backend import docker_available
from tests.support import is_root, require

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ledgermq:latest"


def needs_docker() -> None:
    reason = docker_available()
    require(reason is None, f"docker tier: {reason}")
    require(is_root(), "docker tier: the image build (debootstrap) and volume access need root")


@pytest.fixture(scope="session")
def ledgermq_image() -> str:
    needs_docker()
    started = time.monotonic()
    build = subprocess.run([str(REPO / "docker" / "build-image.sh"), IMAGE], cwd=REPO,
                           capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"docker/build-image.sh failed:\n{build.stderr[-4000:]}", pytrace=False)
    print(f"\nledgermq image {IMAGE} ready in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return IMAGE
