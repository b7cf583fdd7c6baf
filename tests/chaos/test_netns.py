"""The netns backend on real namespaces: per-pair cuts, heal, loss rules, teardown.

Small Python TCP servers stand in for nodes here (the broker itself is
exercised by test_runs.py): each listens on its node's address inside the
namespace, and a connection from node A's address to node B's shows whether
the A->B link is up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.backend import CannotInject, ClusterSpec
from chaos.netns import NetnsBackend, netns_available, node_ip
from tests.support import is_root, require

pytestmark = pytest.mark.timeout(120)

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7700)); s.listen(16)
print("up", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[2], 7700), timeout=0.5,
                             source_address=(sys.argv[1], 0)).close()
    print("open")
except OSError:
    print("blocked")
"""


def link(backend: NetnsBackend, a: int, b: int) -> str:
    _rc, out = backend.run_on(a, [sys.executable, "-c", CONNECT, node_ip(a), node_ip(b)])
    return out.strip()


def wait_open(backend: NetnsBackend, a: int, b: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    state = link(backend, a, b)
    while state != "open" and time.monotonic() < deadline:
        time.sleep(0.05)
        state = link(backend, a, b)
    return state


@pytest.fixture
def backend(tmp_path):
    require(is_root() and netns_available() is None, "needs root, ip and iptables")
    messages: list[str] = []
    b = NetnsBackend(ClusterSpec(nodes=3), tmp_path, log=messages.append)
    b.create_namespace()
    servers = [subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", SERVER,
                                 node_ip(n)], stdout=subprocess.PIPE, text=True)
               for n in b.node_ids]
    b.messages = messages
    try:
        for proc in servers:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield b
    finally:
        for proc in servers:
            proc.kill()
            proc.wait(10)
        b.close()


def test_a_cut_blocks_exactly_that_direction_and_heal_restores(backend) -> None:
    assert wait_open(backend, 1, 2) == "open"
    backend.drop(1, 2)
    assert link(backend, 1, 2) == "blocked"
    # One rule, one direction; TCP needs both, so 2 -> 1 fails too (its SYN-ACK is dropped).
    assert backend.rules().splitlines()[1:] == [
        f"-A {backend.chain} -s {node_ip(1)}/32 -d {node_ip(2)}/32 -j DROP"]
    assert link(backend, 2, 1) == "blocked"
    assert link(backend, 1, 3) == "open" and link(backend, 3, 2) == "open"
    assert link(backend, 2, 3) == "open" and link(backend, 3, 1) == "open"
    backend.heal()
    assert wait_open(backend, 1, 2) == "open"
    assert backend.rules().strip() == f"-N {backend.chain}"


def test_loss_uses_the_statistic_match(backend) -> None:
    backend.drop(2, 3, probability=0.25)
    assert "statistic --mode random --probability 0.25" in backend.rules()
    backend.heal()


def test_the_probe_reports_what_cannot_be_injected(backend) -> None:
    caps = backend.capabilities()
    assert caps["partition"] is None and caps["kill"] is None and caps["power-loss"] is None
    if not backend.netem:
        assert any("no netem" in m for m in backend.messages)
    assert caps["delay"] is not None  # this run was not proxied
    assert any(m.startswith("chaos: CANNOT INJECT delay") for m in backend.messages)
    with pytest.raises(CannotInject):
        backend.shape(1, 2, 100)


def test_teardown_leaves_no_namespace_and_no_chain(tmp_path) -> None:
    require(is_root() and netns_available() is None, "needs root, ip and iptables")
    b = NetnsBackend(ClusterSpec(nodes=3), tmp_path, log=lambda _m: None)
    b.create_namespace()
    name = b.ns
    assert name in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                  text=True).stdout
    b.close()
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout
    b.close()  # idempotent


def test_node_configs_are_valid_toml_with_extra_keys_of_every_type(tmp_path: Path) -> None:
    """The backend writes node configs with the broker's own TOML renderer:
    booleans, numbers and strings in `extra` come back as the broker reads them
    (a hand-written repr() once turned True into invalid TOML)."""
    import tomllib

    from ledgermq.broker.config import parse_config

    spec = ClusterSpec(nodes=3, extra={"auto_create_topics": False, "default_queues": 2,
                                       "reports_dir": 'a "quoted" dir'})
    b = NetnsBackend(spec, tmp_path, log=lambda _m: None)
    (tmp_path / "config").mkdir(parents=True, exist_ok=True)
    b._write_config(2)
    config = parse_config(tomllib.loads((tmp_path / "config" / "n2.toml").read_text()))
    assert config.auto_create_topics is False and config.default_queues == 2
    assert config.reports_dir == 'a "quoted" dir' and config.node_id == 2
    assert sorted(config.peers) == [1, 2, 3]
