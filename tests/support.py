"""Helpers shared by the test tiers.

`require()` is the one way a test says it needs something the machine may lack
(root, network namespaces, Docker, Java). Outside CI the test is skipped with
the reason printed; in CI (`CI=true`) nothing may be skipped silently, so the
test fails instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip (locally) or fail (in CI) the calling test unless `condition` holds."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def have_java() -> bool:
    """True when a Java runtime for PySpark is on PATH or JAVA_HOME."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return True
    return shutil.which("java") is not None


def is_root() -> bool:
    return os.geteuid() == 0


@contextlib.contextmanager
def small_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` (e.g. "512k") mounted at `mount_point` for the
    test: a disk that really fills up (ENOSPC from the kernel). Needs root."""
    require(is_root(), "mounting a tmpfs to fill a disk needs root")
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    require(result.returncode == 0, f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
