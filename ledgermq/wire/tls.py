"""TLS contexts for LedgerMQ's ports, from certificate files (standard `ssl`).

Servers present `cert_file`/`key_file`; when `ca_file` is given they also
require and verify the client's certificate (mutual TLS, as between the
nodes of a group). Clients verify the server against `ca_file` (or the
system's store) and present their own certificate when given one.
"""

from __future__ import annotations

import ssl


def server_context(cert_file: str, key_file: str, ca_file: str = "") -> ssl.SSLContext:
    """A TLS 1.2+ server context; with `ca_file`, clients must present a
    certificate that CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if ca_file:
        context.load_verify_locations(ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "",
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A TLS 1.2+ client context that verifies the server (against `ca_file`,
    else the system's CAs) and presents `cert_file` when given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context
