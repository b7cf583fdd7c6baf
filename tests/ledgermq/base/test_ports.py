"""Free ports come from below the ephemeral range, bind, and never repeat."""

from __future__ import annotations

import socket

from ledgermq.base.ports import _ephemeral_low, free_port, free_ports


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(10_000 <= p < _ephemeral_low() for p in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))  # nothing took it
    assert free_port() not in ports
