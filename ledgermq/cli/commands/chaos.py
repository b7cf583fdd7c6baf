"""`ledgermq chaos run|matrix|list`: chaos tests against a real cluster, the evidence
matrix, the nemeses.

`chaos run` exits 0 when the checker finds nothing wrong, 1 when it finds an
anomaly (or the run could not complete), 2 when a requested fault cannot be
injected on this machine. `--secure` runs the cluster with authentication and
TLS on every port and the workload as an ACL user (docs/chaos.md).
`--retention-bytes N` runs the brokers with retention small enough to delete
segments during the run (small segments, frequent snapshots; chaos.retention)
and reports what was deleted and installed. The membership nemeses
(`replace-each`, `grow`, `shrink`, `remove-leader`, `wipe-repair`,
`membership`) add, remove, replace and repair nodes through the admin apps;
the run gets the spare nodes they need (`--spares` to say how many) and
prints each step with its availability gap. `chaos matrix` runs `python -m
chaos.matrix` (exit 1 when a cell fails; `--retention` for the retention
cells, `--membership` for the membership cells).
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    chaos = typer.Typer(help="Chaos tests: faults against a real cluster, checked histories.",
                        no_args_is_help=True)
    app.add_typer(chaos, name="chaos")

    @chaos.command("list")
    def list_nemeses() -> None:
        """List the nemeses, what each needs and what it does."""
        from chaos.catalog import REGISTRY

        for name, cls in REGISTRY.items():
            typer.echo(f"{name:20} [{', '.join(cls.needs)}]\n    {cls.doc}")

    @chaos.command("matrix", context_settings={"allow_extra_args": True,
                                               "ignore_unknown_options": True})
    def matrix(ctx: typer.Context) -> None:
        """The long evidence matrix (options of `python -m chaos.matrix --help`,
        e.g. --secure, --only, --time-limit)."""
        from chaos.matrix import main as matrix_main

        raise typer.Exit(matrix_main(list(ctx.args)))

    @chaos.command("run")
    def run(
        nodes: int = typer.Option(3, help="Nodes in the broker group (3 or 5)."),
        nemesis: str = typer.Option("partition-halves", help="NAME[,NAME...]; parameters "
                                    "as NAME:key=value+key=value."),
        time_limit: float = typer.Option(60.0, "--time-limit", help="Seconds of faults."),
        rate: float = typer.Option(50.0, help="Sends per second, all producers together."),
        flush: str = typer.Option("sync", help="sync or async."),
        replicate: str = typer.Option("sync", help="sync or async."),
        backend: str = typer.Option("netns", help="netns or docker."),
        out: str = typer.Option(None, help="Run directory (default chaos-runs/<time>)."),
        seed: int = typer.Option(None, help="Random seed (targets, schedule)."),
        schedule: str = typer.Option("fixed", help="fixed (on/off periods) or random."),
        on: float = typer.Option(10.0, help="Seconds a fault period lasts."),
        off: float = typer.Option(10.0, help="Seconds of quiet between fault periods."),
        producers: int = typer.Option(4, help="Producer workers."),
        consumers: int = typer.Option(2, help="Consumers in the group."),
        secure: bool = typer.Option(False, "--secure", help="Authentication and TLS on every "
                                    "port, the workload as an ACL user."),
        retention_bytes: int = typer.Option(0, "--retention-bytes", help="Retention on: keep "
                                            "about this many bytes of log per node (0: off)."),
        segment_size_bytes: int = typer.Option(0, "--segment-size-bytes", help="CommitLog "
                                               "segment size (0: 32 KiB with retention, else "
                                               "the harness's 4 MiB)."),
        retention_interval_ms: int = typer.Option(500, "--retention-interval-ms",
                                                  help="With retention: how often the "
                                                  "leader checks."),
        snapshot_interval_bytes: int = typer.Option(0, "--snapshot-interval-bytes",
                                                    help="With retention: a snapshot every "
                                                    "this many bytes of log (0: half a "
                                                    "segment)."),
        snapshot_interval_entries: int = typer.Option(200, "--snapshot-interval-entries",
                                                      help="With retention: a snapshot every "
                                                      "this many entries."),
        spares: int = typer.Option(-1, help="Spare nodes for the membership nemeses "
                                   "(-1: as many as they need)."),
        coalesce: bool = typer.Option(True, "--coalesce/--no-coalesce", help="The "
                                      "producers' client-side merging; --no-coalesce: every "
                                      "send is its own request (the per-message path)."),
    ) -> None:
        """Run one chaos test; the report lands in --out (index.html, results.json)."""
        import time
        from pathlib import Path

        from chaos.backend import CannotInject
        from chaos.retention import RetentionSpec
        from chaos.runner import RunConfig, main_log
        from chaos.runner import run as run_chaos
        from chaos.schedule import Schedule

        if nodes not in (3, 5):
            raise typer.BadParameter("--nodes must be 3 or 5")
        for name, value in (("flush", flush), ("replicate", replicate)):
            if value not in ("sync", "async"):
                raise typer.BadParameter(f"--{name} must be sync or async")
        retention = None
        broker_config = {}
        try:
            if retention_bytes:
                segment = segment_size_bytes or RetentionSpec.segment_size_bytes
                retention = RetentionSpec(
                    retention_bytes=retention_bytes, segment_size_bytes=segment,
                    retention_interval_ms=retention_interval_ms,
                    snapshot_interval_bytes=snapshot_interval_bytes or segment // 2,
                    snapshot_interval_entries=snapshot_interval_entries)
            elif segment_size_bytes:
                broker_config["segment_size_bytes"] = segment_size_bytes
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        directory = Path(out or f"chaos-runs/{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            config = RunConfig(out=directory, nodes=nodes, nemesis=nemesis,
                               time_limit=time_limit, rate=rate, flush=flush,
                               replicate=replicate, backend=backend, seed=seed,
                               schedule=Schedule(schedule, on, off), producers=producers,
                               consumers=consumers, secure=secure, broker_config=broker_config,
                               retention=retention, spares=None if spares < 0 else spares,
                               coalesce=coalesce)
            results = run_chaos(config, log=main_log)
        except CannotInject as exc:
            main_log(f"chaos: {exc}")
            raise typer.Exit(2) from None
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        check = results["checker"]
        typer.echo(f"valid: {results['valid']}  sends: {check['sends']}")
        typer.echo(f"anomalies: {({k: v for k, v in check['counts'].items() if v})}")
        typer.echo(f"longest unavailability: {results['availability']['longest_s']} s")
        if "retention" in results:
            kept = results["retention"]
            typer.echo(f"retention: {kept['segments_deleted']} segments deleted (nodes "
                       f"{kept['nodes_with_deletions']}), first index up to "
                       f"{kept['first_index_max']}, {kept['installs']} installs (nodes "
                       f"{kept['nodes_installed']}); expired {check['counts']['expired']}, "
                       f"expired_unknown {check['counts']['expired_unknown']}, lost "
                       f"{check['counts']['lost']}")
        if "membership" in results:
            changes = results["membership"]
            for step in changes["steps"]:
                typer.echo(f"membership: {step['step']} {step['nodes']}: "
                           f"{'ok' if step['ok'] else 'FAILED'} in {step['seconds']} s, "
                           f"gap {step['gap_s']} s")
            final = changes["final"] or {}
            typer.echo(f"membership: final voters {final.get('voters')} learners "
                       f"{final.get('learners')}, intended {changes['intended']}")
        typer.echo(f"report: {directory / 'index.html'}")
        raise typer.Exit(0 if results["valid"] else 1)
