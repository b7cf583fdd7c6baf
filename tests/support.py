"""Helpers shared by the test tiers.

`require()` is the one way a test says it needs something the machine may lack
(root, network namespaces, Docker, Java). Outside CI the test is skipped with
the reason printed; in CI (`CI=true`) nothing may be skipped silently, so the
test fails instead.
"""

from __future__ import annotations

import os
import shutil

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
