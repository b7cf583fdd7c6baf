"""`ledgermq namesrv`: run a NameServer until Ctrl-C or SIGTERM.

Prints one line `namesrv listening on HOST:PORT` once bound (with --listen
HOST:0 the port is the one the OS picked), which scripts and tests parse.
"""

from __future__ import annotations

import typer

from ledgermq.base.address import AddressError, split_host_port


def parse_listen(value: str) -> tuple[str, int]:
    """'host:port' -> (host, port); '[::1]:9876' for IPv6. A bad value is a usage error."""
    try:
        return split_host_port(value)
    except AddressError as exc:
        raise typer.BadParameter(str(exc)) from None


def register(app: typer.Typer) -> None:
    @app.command("namesrv")
    def namesrv(
        listen: str = typer.Option("127.0.0.1:9876", help="Address to listen on, HOST:PORT."),
        broker_expiry_ms: int = typer.Option(
            30_000, min=1, help="Drop a broker not heard from for this long (ms)."
        ),
        log_level: str = typer.Option("INFO", help="Python logging level."),
        admin_listen: str = typer.Option(
            "", envvar="LEDGERMQ_NAMESRV_ADMIN_LISTEN",
            help="HOST:PORT of the HTTP admin app (/metrics, /api/v1, dashboard); empty: off."),
        admin_token: str = typer.Option(
            "", envvar="LEDGERMQ_ADMIN_TOKEN",
            help="Token admin writes must carry (only without --cluster-secret-file)."),
        cluster_secret_file: str = typer.Option(
            "", envvar="LEDGERMQ_CLUSTER_SECRET_FILE",
            help="The cluster secret (a 0600 file): only brokers that prove it may register"
            " (clients still read routes anonymously); the admin app signs what it forwards"
            " to brokers with it."),
        admin_access_key: str = typer.Option(
            "admin", envvar="LEDGERMQ_NAMESRV_ADMIN_ACCESS_KEY",
            help="Access key of the administrator the admin app accepts."),
        admin_secret_file: str = typer.Option(
            "", envvar="LEDGERMQ_NAMESRV_ADMIN_SECRET_FILE",
            help="Secret file (0600) of that administrator (the brokers' bootstrap admin)."),
        allow_open: bool = typer.Option(
            False, "--allow-open", envvar="LEDGERMQ_ALLOW_OPEN",
            help="Run without a cluster secret even when listening off loopback."),
        metrics_auth: bool = typer.Option(
            False, "--metrics-auth", envvar="LEDGERMQ_METRICS_AUTH",
            help="With authentication on, /metrics and report files need signed requests."),
        tls_cert_file: str = typer.Option(
            "", envvar="LEDGERMQ_NAMESRV_TLS_CERT_FILE",
            help="Certificate (PEM): the client port serves TLS and the admin app HTTPS."),
        tls_key_file: str = typer.Option(
            "", envvar="LEDGERMQ_NAMESRV_TLS_KEY_FILE", help="Its private key (PEM)."),
        tls_ca_file: str = typer.Option(
            "", envvar="LEDGERMQ_NAMESRV_TLS_CA_FILE",
            help="CA (PEM) that verifies the brokers (their client ports and https admin"
            " apps)."),
        reports_dir: str = typer.Option(
            "", envvar="LEDGERMQ_REPORTS_DIR",
            help="Directory of chaos and audit reports listed by the dashboard; the nightly"
            " audit's latest.json in it (or in its only subdirectory holding one) is the"
            " verdict /api/v1/audit, /metrics and the dashboard show."),
        audit_stale_hours: float = typer.Option(
            36.0, min=0.0001, envvar="LEDGERMQ_AUDIT_STALE_HOURS",
            help="The audit verdict counts as stale once its night finished this long ago."),
    ) -> None:
        """Run a NameServer (route registry) until Ctrl-C or SIGTERM."""
        import asyncio
        import logging
        import signal

        from rich.console import Console

        from ledgermq.base import loop
        from ledgermq.base.exposure import ExposureError
        from ledgermq.base.heap import settle_heap
        from ledgermq.namesrv.admin_http import AdminSecurity
        from ledgermq.namesrv.server import NameServerConfigError, load_security, serve
        from ledgermq.wire.auth import Credentials, SecretFileError, read_secret_file

        host, port = parse_listen(listen)
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        listening = {"client port": listen, **({"admin app": admin_listen} if admin_listen
                                               else {})}
        try:
            # The client port's security and the start-up rule, then the admin app's.
            security = load_security(
                listening, cluster_secret_file=cluster_secret_file, allow_open=allow_open,
                tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                tls_ca_file=tls_ca_file)
            admin_security = AdminSecurity(
                cluster_secret=security.cluster_secret,
                admin=Credentials(admin_access_key, read_secret_file(admin_secret_file))
                if admin_secret_file else None,
                token=admin_token, allow_open=allow_open, metrics_auth=metrics_auth,
                tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                tls_ca_file=tls_ca_file)
        except (NameServerConfigError, SecretFileError, ValueError) as exc:
            Console(stderr=True, highlight=False).print(f"[red]namesrv: {exc}[/red]")
            raise typer.Exit(2) from None
        console = Console(highlight=False)

        def ready(bound_host: str, bound_port: int) -> None:
            # As the broker does: the startup heap leaves the cyclic
            # collector's reach (ledgermq/base/heap.py), so a full collection
            # does not stop route lookups for tens of milliseconds.
            settle_heap()
            # Plain print + flush: this line is an interface (tests and scripts
            # wait for it), so it must not be wrapped or styled.
            print(f"namesrv listening on {bound_host}:{bound_port}", flush=True)

        def admin_ready(url: str) -> None:
            print(f"namesrv admin listening on {url}", flush=True)

        async def main() -> None:
            stop = asyncio.Event()
            running = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                running.add_signal_handler(sig, stop.set)
            await serve(host, port, expiry_ms=broker_expiry_ms, stop=stop, on_ready=ready,
                        admin_listen=admin_listen, admin_security=admin_security,
                        reports_dir=reports_dir, on_admin_ready=admin_ready,
                        security=security, audit_stale_after_s=audit_stale_hours * 3600)

        try:
            loop.run(main())
        except ExposureError as exc:
            console.print(f"[red]namesrv: {exc}[/red]")
            raise typer.Exit(2) from None
        except OSError as exc:
            console.print(f"[red]namesrv: cannot listen on {listen}: {exc}[/red]")
            raise typer.Exit(1) from None
        console.print("namesrv stopped", style="dim")
