"""Expected failures end as one line on stderr and a non-zero exit, never a
traceback: an unknown topic, a refused connection, an admin API error."""

from __future__ import annotations

import pytest
from ops.support import OpsCluster

from ledgermq.base.ports import free_port
from tests.ledgermq.cli.conftest import ledgermq

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_consume_unknown_topic_is_one_line(cluster: OpsCluster) -> None:
    result = ledgermq("consume", "nosuchtopic", "--namesrv", cluster.namesrv_address,
                      "--timeout", "5")
    assert_one_line_error(result, "UNKNOWN_TOPIC", "nosuchtopic")


@pytest.mark.parametrize("args", [
    ("consume", "t"), ("send", "t", "x"), ("topic", "create", "t"), ("topic", "list"),
    ("topic", "describe", "t"), ("status",),
])
def test_refused_namesrv_is_one_line(args: tuple[str, ...]) -> None:
    result = ledgermq(*args, "--namesrv", f"127.0.0.1:{free_port()}")
    assert_one_line_error(result, "refused")


@pytest.mark.parametrize("args", [
    ("status",), ("topic", "list"), ("group", "list"), ("message", "get", "broker-a@" + "0" * 16),
    ("leader", "transfer", "--to", "n2"),
])
def test_unreachable_admin_api_is_one_line(args: tuple[str, ...]) -> None:
    result = ledgermq(*args, "--admin", f"http://127.0.0.1:{free_port()}")
    assert_one_line_error(result, "UNREACHABLE")


def test_admin_api_errors_are_one_line(cluster: OpsCluster) -> None:
    admin = ("--admin", cluster.namesrv_url)
    assert_one_line_error(ledgermq("topic", "describe", "NoSuch", *admin), "404 UNKNOWN_TOPIC")
    assert_one_line_error(ledgermq("message", "get", "broker-a@" + "F" * 16, *admin),
                          "404 NOT_FOUND")
    assert_one_line_error(ledgermq("message", "get", "garbage", *admin), "400")
    assert_one_line_error(ledgermq("group", "reset", "g", "--topic", "t", *admin),
                          "--timestamp-ms", "--offset")
