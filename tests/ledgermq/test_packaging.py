"""Packaging as a user meets it: the console script's --version, and a wheel
that builds without deprecation warnings and carries its licence."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ledgermq

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def test_console_script_prints_the_single_sourced_version() -> None:
    script = Path(sys.executable).with_name("ledgermq")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"ledgermq {ledgermq.__version__}"


def test_the_wheel_builds_cleanly_with_its_licence_and_version(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path),
         str(REPO)], capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    log = build.stdout + build.stderr
    assert "deprecated" not in log.lower(), [line for line in log.splitlines()
                                             if "deprecat" in line.lower()]
    (wheel,) = tmp_path.glob("ledgermq-*.whl")
    assert wheel.name.startswith(f"ledgermq-{ledgermq.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.endswith(".whl") for n in names)
