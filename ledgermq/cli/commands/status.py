"""`ledgermq status`: one table per broker group (node, role, term, indexes,
lag), from the admin API's cluster view (the NameServer's by default)."""

from __future__ import annotations

import typer

from ledgermq.webadmin.app import DEFAULT_ADMIN_URL

ADMIN_OPTION = typer.Option(DEFAULT_ADMIN_URL, "--admin", envvar="LEDGERMQ_ADMIN_URL",
                            help="Admin API base URL (a NameServer's or a broker's).")
# Clusters started without admin apps (`ledgermq dev`) are still reachable over
# the wire protocol through their NameServers.
NAMESRV_OPTION = typer.Option(
    "", "--namesrv", help="Ask these NameServers over the wire protocol instead of the admin"
    " API (for clusters without an admin app); comma separated.")


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION) -> None:
        """Show every broker group's nodes: role, term, indexes and lag."""
        from rich.console import Console
        from rich.table import Table

        from ledgermq.base import loop
        from ledgermq.webadmin.app import AdminApiError, api_call

        console = Console()
        try:
            view = loop.run(wire_view(namesrv) if namesrv else api_call(admin, "GET", "cluster"))
        except AdminApiError as exc:
            console.print(f"[red]status: {exc}[/red]")
            raise typer.Exit(1) from None
        groups = view.get("groups", {})
        if not groups:
            console.print("no broker registered")
            raise typer.Exit(1)
        for name, group in sorted(groups.items()):
            table = Table(title=f"group {name}: leader {group.get('leader') or 'none'},"
                                f" term {group.get('term')}")
            for column in ("node", "address", "role", "term", "last index", "commit index",
                           "applied", "lag", "behind leader"):
                table.add_column(column)
            leader = next((n for n in group["nodes"] if n["node_id"] == group.get("leader")),
                          None)
            followers = (leader or {}).get("followers") or {}
            for node in group["nodes"]:
                if not node["reachable"]:
                    table.add_row(node["node_id"], node["address"], "[red]unreachable[/red]",
                                  "", "", "", "", "", "")
                    continue
                role = node["role"] + ("" if node["role"] != "leader"
                                       or node.get("leader_ready") else " (not ready)")
                f = followers.get(node["node_id"].lstrip("n"))
                table.add_row(node["node_id"], node["address"], role, str(node["term"]),
                              str(node["last_index"]), str(node["commit_index"]),
                              str(node["applied_index"]), str(node["lag"]),
                              str(f["lag"]) if f else "")
            console.print(table)


async def wire_view(namesrv: str) -> dict:
    """The admin API's cluster view, built over the wire protocol instead."""
    from ledgermq.client.admin import Admin
    from ledgermq.webadmin.app import group_view, node_row

    async with Admin(namesrv.split(",")) as admin:
        groups = await admin.status()
    return {"groups": {name: group_view([node_row(r["node_id"], r["address"], r["status"],
                                                  r.get("registered_role")) for r in rows])
                       for name, rows in groups.items()}}
