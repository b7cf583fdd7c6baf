"""The one HOST:PORT parser: what it accepts and how it says no."""

from __future__ import annotations

import pytest

from ledgermq.base.address import AddressError, split_host_port


@pytest.mark.parametrize(("value", "expected"), [
    ("127.0.0.1:9876", ("127.0.0.1", 9876)),
    ("broker-a.local:10911", ("broker-a.local", 10911)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ("[::1]:9876", ("::1", 9876)),
    ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
])
def test_accepts_host_and_port(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize(("value", "why"), [
    ("bogus", "no port"),
    ("127.0.0.1:", "no port"),
    ("127.0.0.1:http", "not a number"),
    ("127.0.0.1:-1", "not a number"),
    ("127.0.0.1: 80", "not a number"),
    ("127.0.0.1:²", "not a number"),
    ("127.0.0.1:65536", "out of range"),
    (":9876", "no host"),
    ("[::1:9876", "brackets"),
    ("::1]:9876", "brackets"),
    ("[]:9876", "brackets"),
])
def test_refuses_with_the_reason(value: str, why: str) -> None:
    with pytest.raises(AddressError, match="expected HOST:PORT") as info:
        split_host_port(value)
    assert why in str(info.value)
    assert repr(value) in str(info.value)


def test_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        split_host_port("nope")


def test_default_host_fills_a_missing_host() -> None:
    assert split_host_port(":7000", default_host="127.0.0.1") == ("127.0.0.1", 7000)
    assert split_host_port("7000", default_host="127.0.0.1") == ("127.0.0.1", 7000)
    assert split_host_port("10.0.0.1:7000", default_host="127.0.0.1") == ("10.0.0.1", 7000)
    with pytest.raises(AddressError, match="not a number"):
        split_host_port("x", default_host="127.0.0.1")
