"""HOST:PORT addresses: the one parser for listen options, peer lists and targets.

`127.0.0.1:9876`, `broker-a.local:10911`, `[::1]:9876` (an IPv6 host in
brackets; the brackets are dropped). Port 0 is valid (the kernel picks one).
A bad value raises `AddressError`, a ValueError whose message names the value
and what is wrong with it.
"""

from __future__ import annotations

_MAX_PORT = 65535


class AddressError(ValueError):
    """A value that is not HOST:PORT."""


def split_host_port(value: str, default_host: str | None = None) -> tuple[str, int]:
    """'host:port' -> (host, port).

    With `default_host`, the host may be left out (`:9876` or `9876`) and is
    then `default_host`; without it a host is required.
    """
    host, sep, port = value.rpartition(":")
    if not sep and default_host is None:
        raise AddressError(f"expected HOST:PORT, got {value!r}: no port")
    if not port:
        raise AddressError(f"expected HOST:PORT, got {value!r}: no port")
    if not (port.isascii() and port.isdigit()):
        raise AddressError(f"expected HOST:PORT, got {value!r}: port {port!r} is not a number")
    if int(port) > _MAX_PORT:
        raise AddressError(
            f"expected HOST:PORT, got {value!r}: port {port} is out of range 0-{_MAX_PORT}")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")) or len(host) < 3:
            raise AddressError(
                f"expected HOST:PORT, got {value!r}: an IPv6 host goes in brackets, [::1]:PORT")
        host = host[1:-1]
    if not host:
        if default_host is None:
            raise AddressError(f"expected HOST:PORT, got {value!r}: no host")
        host = default_host
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    """True for a host only this machine can reach: 127.0.0.0/8, ::1,
    "localhost". A wildcard ("", 0.0.0.0, ::) or any other name is not: a name
    could resolve anywhere, so it counts as reachable from outside."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
