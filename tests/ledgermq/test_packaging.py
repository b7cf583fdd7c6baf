"""Packaging as a user meets it: the console script's --version, and a wheel
that builds without deprecation warnings and carries its licence."""

from __future__ import annotations

import os
import shutil
import site
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


def copy_sources(tmp_path: Path) -> Path:
    """The sources a build needs, copied: pip builds in the tree it is given, and
    a build/ left in the repository would carry stale files into later wheels."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache",
        ".mypy_cache", ".import_linter_cache", "tests", "docs", "bench", "docker"))
    return source


def test_the_wheel_builds_cleanly_with_its_licence_and_version(tmp_path: Path) -> None:
    source = copy_sources(tmp_path)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
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


# The top-level names the wheel may install: the product's namespace and the
# card's folders (ledgermq's own packages live under `ledgermq.`).
TOP_LEVEL = {"ledgermq", "election", "dledger", "commitlog", "consumequeue", "chaos",
             "spark_audit"}


def test_pip_install_into_a_fresh_venv_installs_only_expected_top_level_names(
        tmp_path: Path) -> None:
    """`pip install .` as a user runs it (from a copy of the sources), into a
    fresh venv that sees this environment's packages as its dependencies
    (a .pth line) instead of downloading and unpacking them again: `make
    setup` resolves and installs them from pyproject.toml on every fresh
    clone, and `pip check` here proves the installed package's requirements
    are met. The package itself is built and installed by pip, isolated."""
    source = copy_sources(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_packages,) = venv.glob("lib/python*/site-packages")
    (site_packages / "_deps_from_outer_env.pth").write_text(
        "".join(f"{path}\n" for path in site.getsitepackages()))
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    install = subprocess.run([*pip, "install", "-q", "--no-deps", str(source)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]

    imported = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import ledgermq, sys; print(ledgermq.__file__)"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert str(venv) in imported.stdout
    version = subprocess.run([str(venv / "bin" / "ledgermq"), "--version"], capture_output=True,
                             text=True, env=env, cwd=tmp_path, check=True)
    assert version.stdout.strip() == f"ledgermq {ledgermq.__version__}"

    shown = subprocess.run([*pip, "show", "-f", "ledgermq"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    files = shown.stdout.split("Files:", 1)[1].split()
    top = {f.split("/")[0] for f in files if not f.startswith("..")}
    top = {name for name in top if not name.endswith(".dist-info") and name != "__pycache__"}
    assert top == TOP_LEVEL, sorted(top)
