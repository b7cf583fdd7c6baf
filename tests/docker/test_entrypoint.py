"""The image's entry point renders a broker config from LEDGERMQ_* variables.

Runs on the host against docker/entrypoint.py itself; the rendered text must
load with the broker's own config parser, so the variables documented in
docs/deploy.md cannot drift from what a broker accepts.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from ledgermq.broker.config import parse_config

SPEC = importlib.util.spec_from_file_location(
    "ledgermq_entrypoint", Path(__file__).resolve().parents[2] / "docker" / "entrypoint.py")
assert SPEC is not None and SPEC.loader is not None
entrypoint = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(entrypoint)

BASE = {"LEDGERMQ_GROUP": "broker-a", "LEDGERMQ_NODE_ID": "2",
        "LEDGERMQ_PEERS": "1=10.0.0.11, 2=10.0.0.12:10912, 3=host-c:10913:20913",
        "LEDGERMQ_NAMESRV": "10.0.0.2:9876,10.0.0.3:9876"}


def render(**extra: str) -> dict:
    return tomllib.loads(entrypoint.render_broker_config({**BASE, **extra}))


def test_rendered_config_is_what_the_broker_parses() -> None:
    raw = render(LEDGERMQ_FLUSH="sync", LEDGERMQ_REPLICATE="async",
                 LEDGERMQ_RAFT_TICK_MS="40", LEDGERMQ_CONF_SEGMENT_SIZE_BYTES="4194304",
                 LEDGERMQ_CONF_AUTO_CREATE_TOPICS="false", LEDGERMQ_RAFT_PORT="20911")
    config = parse_config(raw)
    assert (config.group, config.node_id, config.flush, config.replicate) == \
        ("broker-a", 2, "sync", "async")
    assert config.peers[1].raft == "10.0.0.11:20911"
    assert config.peers[1].client == "10.0.0.11:10911"
    assert config.peers[2].client == "10.0.0.12:10912"
    assert config.peers[3].raft == "host-c:20913"
    assert config.namesrv == ("10.0.0.2:9876", "10.0.0.3:9876")
    assert config.tick_ms == 40 and config.segment_size_bytes == 4194304
    assert config.auto_create_topics is False
    # Bound to every interface on the node's own client port; advertised as in peers.
    assert config.listen == "0.0.0.0:10912" and config.raft_bind_host == "0.0.0.0"
    assert config.data_dir == "/var/lib/ledgermq/data"


@pytest.mark.parametrize(("env", "message"), [
    ({"LEDGERMQ_GROUP": ""}, "LEDGERMQ_GROUP"),
    ({"LEDGERMQ_NODE_ID": "4"}, "not an id"),
    ({"LEDGERMQ_PEERS": "1=a:b"}, "expected ID=HOST"),
    ({"LEDGERMQ_PEERS": "x=10.0.0.1"}, "expected ID=HOST"),
])
def test_bad_environment_is_refused_with_the_variable_named(env: dict, message: str) -> None:
    with pytest.raises(entrypoint.ConfigError, match=message):
        entrypoint.render_broker_config({**BASE, **env})


def test_unknown_key_reaches_the_broker_validation() -> None:
    from ledgermq.broker.config import BrokerConfigError

    with pytest.raises(BrokerConfigError, match="no_such_key"):
        parse_config(render(LEDGERMQ_CONF_NO_SUCH_KEY="1"))
