"""examples/ runs as documented: each script a subprocess against a real
local cluster (NameServer + 3-node group), stopping by itself, its output
checked against what was sent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgermq.base import loop
from ledgermq.broker.launcher import REPO, LocalCluster, wait_leader

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


# The cluster runs with authentication on, as `ledgermq dev` does: the
# examples sign in with the variables dev prints.
CREDENTIALS_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("examples"), secure=True,
                      settings={"flush": "async"}) as cluster:
        loop.run(wait_leader(cluster))
        CREDENTIALS_ENV.update(LEDGERMQ_ACCESS_KEY="admin",
                               LEDGERMQ_SECRET_FILE=str(cluster.secret_paths[1]))
        yield cluster.namesrv_address


def example(name: str, *args: str, namesrv: str, cwd: Path,
            via_env: bool = False) -> list[str]:
    """Run examples/<name>; its stdout lines (it must exit 0 by itself)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), **CREDENTIALS_ENV)
    if via_env:
        env["LEDGERMQ_NAMESRV"] = namesrv
    else:
        args = ("--namesrv", namesrv, *args)
    result = subprocess.run([sys.executable, str(REPO / "examples" / name), *args],
                            capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_send_then_consume_with_a_group(namesrv: str, tmp_path: Path) -> None:
    sent = example("send.py", "--topic", "ExGroup", "--count", "12", namesrv=namesrv,
                   cwd=tmp_path, via_env=True)
    bodies = [re.match(r"sent '([^']*)' id=\S+@[0-9A-F]{16}", line).group(1) for line in sent]
    assert bodies == [f"hello {i}" for i in range(12)]
    got = example("consume.py", "--topic", "ExGroup", "--group", "ex-g", "--count", "12",
                  namesrv=namesrv, cwd=tmp_path)
    consumed = [m.group(1) for line in got if (m := re.match(r"got '([^']*)'", line))]
    assert sorted(consumed) == sorted(bodies) and got[-1] == "consumed 12 messages"
    # The group's offsets were committed: a second run finds nothing new.
    again = example("consume.py", "--topic", "ExGroup", "--group", "ex-g", "--count", "1",
                    "--idle", "3", namesrv=namesrv, cwd=tmp_path)
    assert again == ["consumed 0 messages"]


def test_broadcast_gives_every_instance_every_message(namesrv: str, tmp_path: Path) -> None:
    example("send.py", "--topic", "ExCast", "--count", "6", namesrv=namesrv, cwd=tmp_path)
    out = example("broadcast.py", "--topic", "ExCast", "--count", "6", namesrv=namesrv,
                  cwd=tmp_path)
    for instance in ("instance-1", "instance-2"):
        got = [m.group(1) for line in out
               if (m := re.match(rf"{instance} got '([^']*)'", line))]
        assert sorted(got) == [f"hello {i}" for i in range(6)], out
        assert f"{instance} consumed 6 messages" in out
    assert list(tmp_path.iterdir()) == []  # offsets files in a temporary directory


def test_ordered_by_key_consumes_each_order_in_sequence(namesrv: str, tmp_path: Path) -> None:
    out = example("ordered.py", "--topic", "ExOrders", "--orders", "6", namesrv=namesrv,
                  cwd=tmp_path)
    queue_of: dict[str, set[str]] = {}
    for line in out:
        if m := re.match(r"sent (order-\d+) \w+ -> queue (\d+)", line):
            queue_of.setdefault(m.group(1), set()).add(m.group(2))
    assert len(queue_of) == 6 and all(len(q) == 1 for q in queue_of.values())  # one queue each
    events: dict[str, list[str]] = {}
    for line in out:
        if m := re.match(r"got (order-\d+) (\w+) ", line):
            events.setdefault(m.group(1), []).append(m.group(2))
    assert events == {f"order-{i}": ["created", "paid", "shipped", "delivered"]
                      for i in range(6)}, out
    assert out[-1] == "consumed 24 of 24 events"
