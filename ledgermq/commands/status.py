"""`ledgermq status`: one table per broker group: node, role, term, indexes, lag."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated.")) -> None:
        """Show every broker group's nodes as the NameServer and the nodes see them."""
        from rich.console import Console
        from rich.table import Table

        from client.admin import Admin
        from ledgermq import loop

        async def main() -> dict:
            async with Admin(namesrv.split(",")) as admin:
                return await admin.status()

        groups = loop.run(main())
        console = Console()
        if not groups:
            console.print("no broker registered")
            raise typer.Exit(1)
        for group, rows in groups.items():
            table = Table(title=f"group {group}")
            for column in ("node", "address", "role", "term", "last index", "commit index",
                           "applied", "lag"):
                table.add_column(column)
            top = max((r["status"] or {}).get("commit_index", 0) for r in rows)
            for row in rows:
                s = row["status"]
                if s is None:
                    table.add_row(row["node_id"], row["address"], "[red]unreachable[/red]",
                                  "", "", "", "", "")
                    continue
                role = s["role"] + ("" if s["role"] != "leader" or s.get("leader_ready")
                                    else " (not ready)")
                table.add_row(row["node_id"], row["address"], role, str(s["term"]),
                              str(s["last_index"]), str(s["commit_index"]),
                              str(s["applied_index"]), str(top - s["applied_index"]))
            console.print(table)
