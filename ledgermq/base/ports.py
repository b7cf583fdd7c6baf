"""Free TCP ports for servers a test or a local cluster starts on loopback.

Asking the kernel for port 0 and handing the number on is racy: the port is
released at once and falls back into the kernel's ephemeral range, where the
next outgoing connection of any process may take it before the server binds
it (seen in CI: "address already in use" for a broker). Ports are therefore
drawn at random *below* the ephemeral range (`ip_local_port_range`), which
outgoing connections never use, and checked by binding; one process never
hands out the same port twice.
"""

from __future__ import annotations

import random
import socket

_FLOOR = 10_000
_handed_out: set[int] = set()
_rng = random.Random()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on, outside the ephemeral range."""
    high = _ephemeral_low()
    if high - _FLOOR < 1000:  # an unusual range: fall back to the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for _ in range(1000):
        port = _rng.randrange(_FLOOR, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port on {host} between {_FLOOR} and {high}")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    return [free_port(host) for _ in range(n)]
