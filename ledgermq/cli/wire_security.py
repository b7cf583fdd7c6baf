"""How the CLI's wire-protocol commands (send, consume, and the `--namesrv`
paths of topic and status) authenticate: the same `--access-key`,
`--secret-file` and `--tls-ca-file` options (or LEDGERMQ_ACCESS_KEY,
LEDGERMQ_SECRET_FILE, LEDGERMQ_TLS_CA_FILE) as the admin-API commands, turned
into the SDK's `credentials=` and `tls=` (docs/security.md)."""

from __future__ import annotations

from typing import Any


def client_security(access_key: str = "", secret_file: str = "",
                    tls_ca_file: str = "") -> dict[str, Any]:
    """`{"credentials": ..., "tls": ...}` for a Producer, consumer or Cluster;
    a refused secret file or a half-given pair is a one-line CLI error."""
    import ssl

    from ledgermq.cli.errors import fail
    from ledgermq.wire.auth import Credentials, read_secret_file
    from ledgermq.wire.tls import client_context

    if bool(access_key) != bool(secret_file):
        raise fail("an access key and a secret file go together (--access-key/--secret-file"
                   " or LEDGERMQ_ACCESS_KEY/LEDGERMQ_SECRET_FILE)")
    try:
        credentials = Credentials(access_key, read_secret_file(secret_file)) \
            if access_key else None
        tls = client_context(tls_ca_file) if tls_ca_file else None
    except (ValueError, OSError, ssl.SSLError) as exc:  # SecretFileError included
        raise fail(str(exc)) from None
    return {"credentials": credentials, "tls": tls}
