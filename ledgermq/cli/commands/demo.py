"""`ledgermq demo`: the README's walk-through, end to end, on this machine.

Starts a NameServer and a 3-node broker group as child processes, sends and
consumes messages, kills the leader with SIGKILL, shows the new leader, sends
and consumes more, and prints a summary. Authentication is on, as in
`ledgermq dev`: the cluster's secrets are generated under the demo's
directory and the clients use the bootstrap administrator's credentials.
Exits 0 only when no acknowledged message was lost; every child is stopped by
PID on the way out, also on an error or Ctrl-C.
"""

from __future__ import annotations

from typing import Any

import typer


def _odd_group(nodes: int) -> int:
    """A Raft group of 4 or 6 survives no more failed nodes than one of 3 or
    5 and needs one more for each commit: the demo shows the sizes to run."""
    if nodes % 2 == 0:
        raise typer.BadParameter(f"{nodes}: an odd number (3, 5 or 7); a group of {nodes}"
                                 f" survives no more failures than one of {nodes - 1}")
    return nodes


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        directory: str = typer.Option(None, "--dir", help="Data/log directory (default: temp)."),
        messages: int = typer.Option(2000, min=2, help="Messages to send in total."),
        nodes: int = typer.Option(3, min=3, max=7, callback=_odd_group,
                                  help="Nodes in the broker group: 3, 5 or 7."),
        replicate: str = typer.Option("sync", help="replicate: sync or async."),
        flush: str = typer.Option(
            "sync", help="flush: sync (fsync before the ack, the default) or async."),
    ) -> None:
        """Local cluster, send, consume, SIGKILL the leader, fail over, summary."""
        import shutil
        import tempfile
        from pathlib import Path

        from rich.console import Console

        from ledgermq.base import loop

        console = Console(highlight=False)
        # The children run in the repository root: a relative --dir must mean
        # the caller's working directory, not theirs.
        base = (str(Path(directory).expanduser().resolve()) if directory
                else tempfile.mkdtemp(prefix="ledgermq-demo-"))
        try:
            summary = loop.run(_demo(console, base, messages, nodes, replicate, flush))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; children stopped[/yellow]")
            raise typer.Exit(130) from None
        if directory is None:
            shutil.rmtree(base, ignore_errors=True)
        raise typer.Exit(0 if summary["lost"] == 0 else 1)


async def _demo(console: Any, base: str, total: int, nodes: int, replicate: str,
                flush: str) -> dict[str, Any]:
    import asyncio
    import time

    from rich.table import Table

    from ledgermq.broker.launcher import LocalCluster, wait_leader
    from ledgermq.client import Producer, PushConsumer

    cluster = LocalCluster(base, nodes=nodes, secure=True,
                           settings={"replicate": replicate, "flush": flush,
                                     "segment_size_bytes": 64 << 20})
    acked: dict[bytes, str | None] = {}
    failed = 0
    received: set[bytes] = set()
    deliveries = 0
    try:
        with console.status(f"starting a NameServer and a {nodes}-node broker group"):
            cluster.start()  # main thread: the children outlive no launcher thread
            leader = await wait_leader(cluster)
        console.print(f"cluster up under {base}: NameServer {cluster.namesrv_address}, "
                      f"leader [bold]n{leader}[/bold] (pids {cluster.pids()})")
        ns = [cluster.namesrv_address]
        credentials = cluster.admin_credentials
        console.print(f"authentication on: clients sign in as {credentials.access_key!r} "
                      f"(secret in {cluster.secret_paths[1]})")
        producer = Producer(ns, retry_timeout=30.0, credentials=credentials)
        await producer.create_topic("demo", queues=4)

        def on_message(message: Any) -> None:
            nonlocal deliveries
            deliveries += 1
            received.add(message.body)

        consumer = PushConsumer(ns, "demo-group", "demo", on_message, long_poll_ms=500,
                                batch_size=256, credentials=credentials)
        await consumer.start()

        async def send_range(lo: int, hi: int) -> list[float]:
            nonlocal failed
            sem = asyncio.Semaphore(64)
            ack_times: list[float] = []

            async def one(i: int) -> None:
                nonlocal failed
                async with sem:
                    body = b"demo-%06d" % i
                    try:
                        result = await producer.send("demo", body)
                    except Exception:
                        failed += 1
                        return
                    acked[body] = result.msg_id
                    ack_times.append(time.monotonic())

            await asyncio.gather(*(one(i) for i in range(lo, hi)))
            return ack_times

        async def consumed_all(timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if set(acked) <= received:
                    return True
                await asyncio.sleep(0.05)
            return False

        half = total // 2
        await send_range(0, half)
        await consumed_all(60)
        console.print(f"phase 1: {len(acked)} acknowledged, {len(received)} consumed")

        pid = cluster.brokers[leader].proc.pid
        console.print(f"[red]SIGKILL leader n{leader}[/red] (pid {pid})")
        cluster.kill(leader)
        killed_at = time.monotonic()
        sending = asyncio.create_task(send_range(half, total))
        new_leader = await wait_leader(cluster, exclude=(leader,))
        # Found by polling the nodes' status, so later than the election
        # itself: the producer's first acknowledgement after the kill (the
        # summary's failover_s) can come sooner.
        console.print(f"new leader: [bold]n{new_leader}[/bold] "
                      f"(found by polling {time.monotonic() - killed_at:.2f} s after the kill)")
        ack_times = await sending
        failover = (min(ack_times) - killed_at) if ack_times else float("nan")
        complete = await consumed_all(60)
        console.print(f"phase 2: {len(acked)} acknowledged, {len(received)} consumed")
        await consumer.stop()
        await producer.close()
        lost = len(set(acked) - received)
        summary = {"acknowledged": len(acked), "consumed": len(received),
                   "redelivered": deliveries - len(received), "not_acknowledged": failed,
                   "lost": lost, "failover_s": round(failover, 3),
                   "old_leader": leader, "new_leader": new_leader, "complete": complete}
        table = Table(title="LedgerMQ demo summary")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            style = "bold green" if key == "lost" and value == 0 else (
                "bold red" if key == "lost" else "")
            table.add_row(key, f"[{style}]{value}[/{style}]" if style else str(value))
        console.print(table)
        return summary
    finally:
        await asyncio.to_thread(cluster.stop)
