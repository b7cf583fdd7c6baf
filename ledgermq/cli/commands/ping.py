"""`ledgermq ping ADDR`: one PING round trip to a NameServer or broker.

The container health check: exit 0 when the server at HOST:PORT completes
the handshake and echoes a PING within the timeout, exit 1 (with the reason
on stderr) otherwise. Every LedgerMQ server answers PING (docs/protocol.md),
also before authentication. With credentials (`--access-key`/`--secret-file`
or LEDGERMQ_ACCESS_KEY/LEDGERMQ_SECRET_FILE) the ping authenticates first and
checks the server's proof, so it also fails against a server that does not
know the secret (or runs without authentication); `--tls-ca-file` connects
with TLS, verifying the server's certificate.
"""

from __future__ import annotations

import typer

from ledgermq.cli.admin_api import ACCESS_KEY_OPTION, SECRET_FILE_OPTION, TLS_CA_OPTION


def register(app: typer.Typer) -> None:
    @app.command("ping")
    def ping(
        address: str = typer.Argument(..., help="Server address, HOST:PORT."),
        timeout: float = typer.Option(3.0, min=0.1, help="Seconds for connect and reply."),
        access_key: str = ACCESS_KEY_OPTION,
        secret_file: str = SECRET_FILE_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Send one PING to a NameServer or broker; exit 1 if it does not answer."""
        import sys
        import time

        from ledgermq.base import loop
        from ledgermq.base.codes import RequestCode
        from ledgermq.base.errors import LedgerMQError
        from ledgermq.cli.commands.namesrv import parse_listen
        from ledgermq.cli.wire_security import client_security
        from ledgermq.wire.rpc_client import RpcClient

        host, port = parse_listen(address)
        security = client_security(access_key, secret_file, tls_ca_file)
        credentials = security["credentials"]

        async def main() -> float:
            started = time.monotonic()
            async with await RpcClient.connect(host, port, role="admin", name="ping",
                                               timeout=timeout, credentials=credentials,
                                               ssl=security["tls"]) as client:
                token = f"ping-{started}"
                echoed = await client.request(RequestCode.PING, token)
                if echoed != token:
                    raise LedgerMQError(f"PING echoed {echoed!r}, sent {token!r}")
            return time.monotonic() - started

        try:
            elapsed = loop.run(main())
        except (OSError, LedgerMQError) as exc:  # ssl.SSLError is an OSError
            print(f"ping {address}: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        authenticated = f" as {credentials.access_key}" if credentials else ""
        print(f"ping {address}: ok{authenticated} in {elapsed * 1000:.1f} ms")
