"""`ledgermq ping ADDR`: one PING round trip to a NameServer or broker.

The container health check: exit 0 when the server at HOST:PORT completes
the handshake and echoes a PING within the timeout, exit 1 (with the reason
on stderr) otherwise. Every LedgerMQ server answers PING (docs/protocol.md).
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("ping")
    def ping(
        address: str = typer.Argument(..., help="Server address, HOST:PORT."),
        timeout: float = typer.Option(3.0, min=0.1, help="Seconds for connect and reply."),
    ) -> None:
        """Send one PING to a NameServer or broker; exit 1 if it does not answer."""
        import sys
        import time

        from ledgermq.base import loop
        from ledgermq.base.codes import RequestCode
        from ledgermq.base.errors import LedgerMQError
        from ledgermq.cli.commands.namesrv import parse_listen
        from ledgermq.wire.rpc import RpcClient

        host, port = parse_listen(address)

        async def main() -> float:
            started = time.monotonic()
            async with await RpcClient.connect(host, port, role="admin", name="ping",
                                               timeout=timeout) as client:
                token = f"ping-{started}"
                echoed = await client.request(RequestCode.PING, token)
                if echoed != token:
                    raise LedgerMQError(f"PING echoed {echoed!r}, sent {token!r}")
            return time.monotonic() - started

        try:
            elapsed = loop.run(main())
        except (OSError, LedgerMQError) as exc:
            print(f"ping {address}: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        print(f"ping {address}: ok in {elapsed * 1000:.1f} ms")
