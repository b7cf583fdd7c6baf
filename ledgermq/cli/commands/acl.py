"""`ledgermq acl user add|remove|list`, `ledgermq acl grant|revoke`: ACL users
and their grants (docs/security.md, "Authorisation: the ACL"), over the wire protocol.

Every broker group holds its own replicated ACL, so a change goes to the
leader of every group the NameServers know (or of the one `--group` names).
The caller proves itself with `--access-key`/`--secret-file` (or
LEDGERMQ_ACCESS_KEY / LEDGERMQ_SECRET_FILE): an administrator's credentials,
on a cluster with authentication on. `user add` reads the new user's secret
from `--user-secret-file`, or, when that file does not exist yet, generates
one and writes it there with mode 0600.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ledgermq.base.codes import RequestCode
from ledgermq.cli.output import OUTPUT_OPTION, Output
from ledgermq.wire.auth import Credentials

acl_app = typer.Typer(help="Manage ACL users and their topic and group grants.",
                      no_args_is_help=True)
user_app = typer.Typer(help="Add, remove and list ACL users.", no_args_is_help=True)
acl_app.add_typer(user_app, name="user")

NAMESRV = typer.Option("127.0.0.1:9876", "--namesrv", envvar="LEDGERMQ_NAMESRV",
                       help="NameServer address(es), comma separated.")
GROUP = typer.Option("", "--group", help="Only this broker group (default: every group).")
ACCESS_KEY = typer.Option("", "--access-key", envvar="LEDGERMQ_ACCESS_KEY",
                          help="Your access key (an administrator's).")
SECRET_FILE = typer.Option("", "--secret-file", envvar="LEDGERMQ_SECRET_FILE",
                           help="File holding your secret (mode 0600).")
TOPIC_GRANTS = typer.Option([], "--topic", help="A topic grant NAME=PERM (NAME may be *;"
                            " PERM: PUB, SUB, PUB|SUB or DENY); repeatable.")
GROUP_GRANTS = typer.Option([], "--consumer-group", help="A consumer group grant NAME=PERM"
                            " (NAME may be *; PERM: SUB or DENY); repeatable.")

USER_SECRET_FILE = typer.Option(
    None, "--user-secret-file", help="The user's secret: read from this file if it exists,"
    " else generated and written there (0600). Default: ./ACCESS_KEY.secret")
ALLOW = typer.Option([], "--allow", help="Connect only from this CIDR; repeatable"
                     " (default: any address).")
REVOKED_TOPICS = typer.Option([], "--topic", help="Remove this topic's grant; repeatable.")
REVOKED_GROUPS = typer.Option([], "--consumer-group",
                              help="Remove this consumer group's grant; repeatable.")


def credentials(access_key: str, secret_file: str) -> Credentials | None:
    """The caller's own credentials, None when neither is given."""
    from ledgermq.cli.errors import fail
    from ledgermq.wire.auth import read_secret_file

    if not access_key and not secret_file:
        return None
    if not access_key or not secret_file:
        raise fail("give --access-key and --secret-file together"
                   " (or LEDGERMQ_ACCESS_KEY and LEDGERMQ_SECRET_FILE)")
    try:
        return Credentials(access_key, read_secret_file(secret_file))
    except ValueError as exc:  # SecretFileError, or a key Credentials refuses
        raise fail(str(exc)) from None


def parse_grants(items: list[str], what: str) -> dict[str, str]:
    from ledgermq.cli.errors import fail

    out = {}
    for item in items:
        name, sep, perm = item.partition("=")
        if not sep or not name or not perm:
            raise fail(f"a {what} grant is NAME=PERM, not {item!r}")
        out[name] = perm.upper()
    return out


async def _request(host: str, port: int, creds: Credentials | None, code: int,
                   body: Any) -> Any:
    from ledgermq.wire import RpcClient

    # Only with credentials: a server without authentication has none to check.
    auth: dict[str, Any] = {"credentials": creds} if creds is not None else {}
    client = await RpcClient.connect(host, port, role="admin", name="ledgermq-acl", **auth)
    try:
        return await client.request(code, body)
    finally:
        await client.close()


async def _on_leader(addresses: list[str], creds: Credentials | None, code: int,
                     body: Any, patience: float = 10.0) -> Any:
    """`code` on the group's leader: the registered one first, then wherever
    a follower says the leader is; while the group has no leader (an election
    in progress) the round is tried again for up to `patience` seconds."""
    import asyncio
    import time

    from ledgermq.base.address import split_host_port
    from ledgermq.base.errors import NotLeaderError, ServiceUnavailableError

    deadline = time.monotonic() + patience
    last: Exception | None = None
    while True:
        tried: set[str] = set()
        queue = list(addresses)
        while queue:
            address = queue.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                return await _request(*split_host_port(address), creds, code, body)
            except NotLeaderError as exc:
                last = exc
                if exc.leader:
                    queue.insert(0, exc.leader)
            except (OSError, ServiceUnavailableError) as exc:
                last = exc
        assert last is not None
        if time.monotonic() >= deadline:
            raise last
        await asyncio.sleep(0.2)


def on_groups(namesrv: str, group: str, creds: Credentials | None, code: int,
              body: Any) -> dict[str, Any]:
    """Run one ACL request on the leader of every broker group (or `group`);
    each group's answer by group name."""
    from ledgermq.base import loop
    from ledgermq.cli.errors import fail
    from ledgermq.client.admin import Admin

    async def main() -> dict[str, Any]:
        async with Admin(namesrv.split(",")) as admin:
            view = await admin.cluster_view()
        groups = view.get("groups", {})
        if group:
            groups = {group: groups[group]} if group in groups else {}
        if not groups:
            raise fail(f"no broker group {group!r} is registered" if group
                       else "no broker group is registered with the NameServers")
        out = {}
        for name, info in sorted(groups.items()):
            nodes = info.get("nodes", [])
            leader = [n["address"] for n in nodes if n.get("node_id") == info.get("leader")]
            out[name] = await _on_leader(leader + [n["address"] for n in nodes], creds,
                                         code, body)
        return out

    result: dict[str, Any] = loop.run(main())
    return result


def _describe(user: dict[str, Any]) -> str:
    grants = [f"topic {k}={v}" for k, v in user["topics"].items()]
    grants += [f"group {k}={v}" for k, v in user["groups"].items()]
    allow = f" from {','.join(user['allow'])}" if user["allow"] else ""
    admin = " admin" if user["admin"] else ""
    return f"{user['access_key']}{admin}{allow}: {', '.join(grants) or 'no grants'}"


@user_app.command("add")
def user_add(
    user_key: str = typer.Argument(..., metavar="ACCESS_KEY", help="The new user's access key."),
    user_secret_file: Path = USER_SECRET_FILE,
    admin: bool = typer.Option(False, "--admin", help="May run admin operations."),
    allow: list[str] = ALLOW,
    topic: list[str] = TOPIC_GRANTS, consumer_group: list[str] = GROUP_GRANTS,
    namesrv: str = NAMESRV, group: str = GROUP,
    access_key: str = ACCESS_KEY, secret_file: str = SECRET_FILE,
) -> None:
    """Create (or replace) a user with its secret, flags and grants."""
    from ledgermq.cli.errors import fail
    from ledgermq.wire.auth import SecretFileError, read_secret_file, write_secret_file

    creds = credentials(access_key, secret_file)
    path = user_secret_file or Path(f"{user_key}.secret")
    body = {"access_key": user_key, "admin": admin, "allow": allow,
            "topics": parse_grants(topic, "topic"),
            "groups": parse_grants(consumer_group, "consumer group")}
    made = not path.exists()
    try:
        body["secret"] = write_secret_file(path) if made else read_secret_file(path)
    except SecretFileError as exc:
        raise fail(str(exc)) from None
    for name, reply in on_groups(namesrv, group, creds, RequestCode.ACL_PUT_USER,
                                 body).items():
        verb = "created" if reply["created"] else "replaced"
        typer.echo(f"{name}: {verb} {_describe(reply['user'])}")
    if made:
        typer.echo(f"secret of {user_key} written to {path.resolve()} (mode 0600)")


@user_app.command("remove")
def user_remove(
    user_key: str = typer.Argument(..., metavar="ACCESS_KEY"),
    namesrv: str = NAMESRV, group: str = GROUP,
    access_key: str = ACCESS_KEY, secret_file: str = SECRET_FILE,
) -> None:
    """Delete a user (its open connections lose every right at once)."""
    creds = credentials(access_key, secret_file)
    for name, reply in on_groups(namesrv, group, creds, RequestCode.ACL_DELETE_USER,
                                 {"access_key": user_key}).items():
        typer.echo(f"{name}: {'removed' if reply['deleted'] else 'no such user'} {user_key}")


@user_app.command("list")
def user_list(
    namesrv: str = NAMESRV, group: str = GROUP,
    access_key: str = ACCESS_KEY, secret_file: str = SECRET_FILE,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List users and their grants (never their secrets)."""
    from ledgermq.cli.output import console, print_json, table

    creds = credentials(access_key, secret_file)
    replies = on_groups(namesrv, group, creds, RequestCode.ACL_GET_USERS, None)
    if output is Output.json:
        print_json({"groups": {g: r["users"] for g, r in replies.items()}})
        return
    t = table("ACL users", ("group", "access key", "admin", "allow", "topics", "groups"),
              keep=("group", "access key"))
    for name, reply in replies.items():
        for u in reply["users"]:
            t.add_row(name, u["access_key"], "yes" if u["admin"] else "",
                      ",".join(u["allow"]) or "any",
                      " ".join(f"{k}={v}" for k, v in u["topics"].items()),
                      " ".join(f"{k}={v}" for k, v in u["groups"].items()))
    console().print(t)


@acl_app.command("grant")
def grant(
    user_key: str = typer.Argument(..., metavar="ACCESS_KEY"),
    topic: list[str] = TOPIC_GRANTS, consumer_group: list[str] = GROUP_GRANTS,
    namesrv: str = NAMESRV, group: str = GROUP,
    access_key: str = ACCESS_KEY, secret_file: str = SECRET_FILE,
) -> None:
    """Add or change grants of a user."""
    creds = credentials(access_key, secret_file)
    body = {"access_key": user_key, "topics": parse_grants(topic, "topic"),
            "groups": parse_grants(consumer_group, "consumer group")}
    for name, reply in on_groups(namesrv, group, creds, RequestCode.ACL_GRANT, body).items():
        typer.echo(f"{name}: {_describe(reply['user'])}")


@acl_app.command("revoke")
def revoke(
    user_key: str = typer.Argument(..., metavar="ACCESS_KEY"),
    topic: list[str] = REVOKED_TOPICS, consumer_group: list[str] = REVOKED_GROUPS,
    namesrv: str = NAMESRV, group: str = GROUP,
    access_key: str = ACCESS_KEY, secret_file: str = SECRET_FILE,
) -> None:
    """Remove grants of a user (the names fall back to its * grant, else DENY)."""
    creds = credentials(access_key, secret_file)
    body = {"access_key": user_key, "topics": topic, "groups": consumer_group}
    for name, reply in on_groups(namesrv, group, creds, RequestCode.ACL_REVOKE, body).items():
        typer.echo(f"{name}: {_describe(reply['user'])}")


def register(app: typer.Typer) -> None:
    app.add_typer(acl_app, name="acl")
