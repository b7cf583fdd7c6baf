"""The newcomer path: README's "Playing by hand" on a fresh clone, and
`ledgermq dev` started from a directory other than the repository's."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledgermq.base.ports import free_port
from ledgermq.broker.launcher import REPO
from tests.ledgermq.broker.test_cli import wait_gone
from tests.ledgermq.cli.conftest import ledgermq

pytestmark = [pytest.mark.timeout(180)]


def playing_by_hand() -> list[list[str]]:
    """The commands of README's "Playing by hand" shell blocks, comments dropped."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"## Playing by hand\n(.*?)\n## ", text, re.S)
    assert section, "README has no 'Playing by hand' section"
    blocks = re.findall(r"```sh\n(.*?)```", section.group(1), re.S)
    assert blocks, "'Playing by hand' has no shell block"
    return [words for block in blocks for line in block.splitlines()
            if (words := shlex.split(line, comments=True))]


def test_readme_playing_by_hand_works_on_a_fresh_clone() -> None:
    commands = playing_by_hand()
    # A fresh clone has no .venv: the block creates it before anything uses it.
    assert commands[0] == ["make", "setup"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^setup:", makefile, re.M)
    for words in commands:
        assert words[0] != "open", "macOS-only `open`"
        if words[0] == "export":  # the credentials `ledgermq dev` prints
            assert words[1].split("=")[0] in ("LEDGERMQ_ACCESS_KEY", "LEDGERMQ_SECRET_FILE")
            continue
        if words[0] != "ledgermq":
            assert words[:2] in (["make", "setup"], ["source", ".venv/bin/activate"]), words
            continue
        # Every ledgermq command of the block exists with the options it uses.
        path = [w for w in words[1:] if not w.startswith("-")][:2]
        helped = ledgermq(*path, "--help")
        if helped.returncode != 0:  # `topic create NAME`: the name is no subcommand
            helped = ledgermq(*path[:1], "--help")
        assert helped.returncode == 0, (words, helped.stderr)
        for option in (w for w in words if w.startswith("--")):
            assert option in helped.stdout, (words, option)


@pytest.mark.slow
def test_dev_from_another_directory_with_a_relative_dir(tmp_path: Path) -> None:
    ns, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    dev = subprocess.Popen(
        [sys.executable, "-m", "ledgermq.cli", "dev", "--dir", "play", "--namesrv", ns,
         "--admin", admin], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=tmp_path)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert dev.stdout is not None
        for line in dev.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    pids: list[int] = []
    try:
        assert ready.wait(60) and dev.poll() is None, "".join(lines)
        pids = [int(m.group(1)) for line in lines
                if (m := re.search(r"(?:namesrv|broker n\d[^│]*)\s*│\s*(\d+)", line))]
        assert len(pids) == 4, "".join(lines)
        assert str(tmp_path / "play") in "".join(lines)
        for nid in (1, 2, 3):
            assert (tmp_path / "play" / f"n{nid}").is_dir()
        # Authentication is on: the secrets went under the relative --dir too.
        secret = tmp_path / "play" / "secrets" / "admin.secret"
        assert f"export LEDGERMQ_SECRET_FILE={secret}" in "".join(lines)
        creds = ("--access-key", "admin", "--secret-file", str(secret))
        sent = ledgermq("send", "here", "one", "--namesrv", ns, *creds, cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        deadline = time.monotonic() + 30  # until the brokers have registered
        while (status := ledgermq("status", "--admin", f"http://{admin}", *creds,
                                  cwd=tmp_path)).returncode != 0:
            assert time.monotonic() < deadline, status.stderr
            time.sleep(0.5)
        assert "leader" in status.stdout
    finally:
        if dev.poll() is None:
            os.kill(dev.pid, signal.SIGINT)
        dev.wait(60)
    assert dev.returncode == 0, "".join(lines)
    wait_gone(pids)
    assert not (REPO / "play").exists()
