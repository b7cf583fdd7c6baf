"""``ledgermq audit``: the Spark consistency audit of replicas and client histories.

``--cut GROUP=INDEX`` / ``--from GROUP=INDEX`` audit a window of a group's log;
``--nightly --state DIR`` runs one night of the incremental audit (docs/audit.md,
"Nightly, incremental"). Exit status: 0 passed, 1 a check failed, 2 the inputs
could not be read.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    Target,
)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` command group to the ledgermq CLI."""
    from ledgermq.cli import audit_cut, audit_schedule
    from ledgermq.cli.default_group import DefaultCommandGroup

    audit_app = typer.Typer(cls=DefaultCommandGroup, no_args_is_help=True,
                            help="The consistency audit: run it (the default), capture a "
                                 "live cut, or schedule it.")

    @audit_app.command("run")
    def audit(
        group_specs: Annotated[list[str], typer.Argument(
            help="NAME=DIR,DIR,... or a ROOT/<group>/<node>/ directory (paths or URIs)")],
        master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
        out: Annotated[str, typer.Option(help="output directory")] = "audit-out",
        history: Annotated[list[str] | None, typer.Option(
            help="client history.jsonl (repeatable)")] = None,
        engine: Annotated[str, typer.Option(
            help="spark, or python (in-process, local paths only)")] = "spark",
        driver_memory: Annotated[str, typer.Option(help="Spark driver memory")] = "4g",
        progress: Annotated[bool, typer.Option(help="Spark console progress bar")] = True,
        max_entry_size: Annotated[int, typer.Option(
            help="the brokers' entry_size_bytes_max")] = 64 * 1024 * 1024,
        segment_size: Annotated[int, typer.Option(
            help="segment_size_bytes (0: inferred from segment names)")] = 0,
        cut: Annotated[list[str] | None, typer.Option(
            "--cut", metavar="GROUP=INDEX",
            help="audit GROUP only up to this Raft index: bytes and ConsumeQueue units past "
                 "it are neither read nor judged (repeatable)")] = None,
        window_from: Annotated[list[str] | None, typer.Option(
            "--from", metavar="GROUP=INDEX",
            help="audit GROUP only from this Raft index (the entries before count as "
                 "verified before; repeatable)")] = None,
        nightly: Annotated[bool, typer.Option(
            "--nightly", help="one night of the incremental audit (needs --state)")] = False,
        state: Annotated[str | None, typer.Option(
            metavar="DIR", help="the nightly state directory (manifests, nights)")] = None,
        rolling_nights: Annotated[int, typer.Option(
            metavar="N", help="re-verify every retained index within N nights")] = 7,
        digest_block: Annotated[int, typer.Option(
            metavar="B", help="a new manifest's digest span (power of two up to 2^19; "
                              "0: 65536)")] = 0,
        manifest_key_file: Annotated[str, typer.Option(
            metavar="FILE", help="a secret file (mode 0600) whose content keys the "
                                 "manifests' seals (HMAC-SHA256): a manifest rewritten "
                                 "without the key is refused")] = "",
        live: Annotated[list[str] | None, typer.Option(
            "--live", metavar="ADMIN_URL",
            help="the brokers' admin URLs (repeatable or comma separated): capture each "
                 "group's commit index there first and audit up to it (a live cut)")] = None,
        access_key: str = ACCESS_KEY_OPTION,
        secret_file: str = SECRET_FILE_OPTION,
        token: str = TOKEN_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Cross-check every replica's files and the client histories; exit 1 on failure."""
        from spark_audit import cli
        from spark_audit.runs import ENGINES

        if engine not in ENGINES:  # anything else used to mean spark
            raise typer.BadParameter(f"{engine!r} is not {' or '.join(ENGINES)}",
                                     param_hint="--engine")

        if live:
            cut = audit_cut.live_cuts(audit_cut.split_urls(live), cut or [], Target(
                "", access_key, secret_file, token, tls_ca_file))

        if nightly or state:
            if not (nightly and state):
                typer.echo("audit: --nightly needs --state DIR (and --state goes with "
                           "--nightly)", err=True)
                raise typer.Exit(2)
            if history or window_from:
                typer.echo("audit: --nightly chooses its own windows and reads no history",
                           err=True)
                raise typer.Exit(2)
            raise typer.Exit(cli.nightly(
                group_specs, state, rolling_nights=rolling_nights, cuts=cut or [],
                engine=engine, master=master, driver_memory=driver_memory, progress=progress,
                max_entry_size=max_entry_size, segment_size=segment_size,
                digest_block=digest_block, manifest_key_file=manifest_key_file))
        raise typer.Exit(cli.run(group_specs, out=out, master=master, history=history or [],
                                 engine=engine, driver_memory=driver_memory, progress=progress,
                                 max_entry_size=max_entry_size, segment_size=segment_size,
                                 cuts=cut or [], starts=window_from or []))

    audit_cut.register(audit_app)
    audit_schedule.register(audit_app)
    app.add_typer(audit_app, name="audit")
