"""The live cut: each broker group's commit index, asked of the running brokers.

A live audit reads files the brokers keep writing. It audits every group only
up to a *cut* (``ledgermq audit --cut GROUP=INDEX``, docs/audit.md) captured
before it starts: entries at or below the cut are committed, hence on the
files of a majority and never truncated again (a follower may still lag,
which the audit reports as such); entries above it are not read or judged.

`capture` asks every given admin URL (one per broker, as the dashboard and
``ledgermq status`` reach them, signed like every CLI admin call) for
``GET /api/v1/status`` concurrently, checks each answer strictly and returns
per group the **highest commit index any of its nodes reports**. Why that
and not only the leader's: by Raft's rules every node's commit index names a
committed entry (a follower adopts min(the leader's commit, the last entry
it matched), a leader commits only what a majority stored), so the highest
is committed and is the freshest. It is the leader's in a stable group;
right after an election the new leader's can be *lower* than a follower's
(it learns the commit only once an entry of its own term commits), and
during an election there is no leader to ask at all. `GroupCut.source` says
who gave the index and whether it was the leader.

Every URL must answer, with a broker's status: an unreachable broker, an
error answer, or an answer that is not a well-formed status (not JSON, a
NameServer's, a field of the wrong type, an index beyond 2^63-1, a commit
beyond the node's own last index, two URLs claiming one node) is a
`CutError` naming the URL and what was wrong, never a silently smaller cut.
The scheduled audit treats that as a failed night and tries again at the
next one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    Target,
)

INDEX_MAX = 2**63 - 1
# A group name must survive `--cut GROUP=INDEX` and a `NAME=DIR,...` spec:
# no separators, no whitespace or control characters.
_GROUP = re.compile(r"[^\s=,/\x00-\x1f\x7f]{1,255}")  # matched whole
NOT_BROKER = "not a broker's admin API (give each broker's admin URL, not the NameServer's)"


class CutError(ValueError):
    """The cut could not be captured: a broker did not answer or answered garbage."""


@dataclass(frozen=True)
class NodeReport:
    """One broker's answer, checked."""

    url: str
    group: str
    node_id: int
    role: str
    term: int
    commit_index: int
    last_index: int


@dataclass(frozen=True)
class GroupCut:
    """The cut of one group: `index` and how it was chosen."""

    group: str
    index: int
    source: str  # e.g. "n1 (leader, term 3)" or "n2 (the leader n1 reports 98)"
    nodes: tuple[NodeReport, ...]


@dataclass(frozen=True)
class LiveCut:
    """Every group's cut, from one round of questions."""

    groups: dict[str, GroupCut]

    @property
    def indexes(self) -> dict[str, int]:
        """{group: commit index}: what `--cut` takes."""
        return {name: cut.index for name, cut in sorted(self.groups.items())}

    def cut_args(self) -> list[str]:
        """`--cut GROUP=INDEX` for every group, for an audit command line."""
        return [arg for name, index in self.indexes.items()
                for arg in ("--cut", f"{name}={index}")]

    def describe(self) -> str:
        """One line: `broker-a=5000 from n1 (leader, term 3); ...`."""
        return "; ".join(f"{name}={cut.index} from {cut.source}"
                         for name, cut in sorted(self.groups.items()))


def _int_field(url: str, answer: dict[str, Any], key: str, low: int = 0) -> int:
    value = answer.get(key)
    # bool is an int in Python; a JSON true is not an index.
    if not isinstance(value, int) or isinstance(value, bool):
        raise CutError(f"{url}: /api/v1/status field {key!r} is {value!r}, not an integer")
    if not low <= value <= INDEX_MAX:
        raise CutError(f"{url}: /api/v1/status field {key!r} = {value} is outside "
                       f"[{low}, 2^63-1]")
    return value


def parse_status(url: str, answer: Any) -> NodeReport:
    """A broker's `/api/v1/status` answer, checked; CutError says what is wrong."""
    if not isinstance(answer, dict):
        raise CutError(f"{url}: /api/v1/status answered {type(answer).__name__}, "
                       "not a JSON object")
    if "error" in answer and "group" not in answer:
        err = answer["error"]
        detail = err.get("message") if isinstance(err, dict) else err
        raise CutError(f"{url}: /api/v1/status answered an error: {str(detail)[:200]}")
    group = answer.get("group")
    if group is None:
        raise CutError(f"{url}: /api/v1/status has no 'group': {NOT_BROKER}")
    if not isinstance(group, str) or not _GROUP.fullmatch(group):
        raise CutError(f"{url}: /api/v1/status field 'group' is {str(group)[:80]!r}, not a "
                       "group name")
    role = answer.get("role")
    if not isinstance(role, str) or not role:
        raise CutError(f"{url}: /api/v1/status field 'role' is {role!r}, not a role")
    report = NodeReport(url=url, group=group, node_id=_int_field(url, answer, "node_id", 1),
                        role=role, term=_int_field(url, answer, "term"),
                        commit_index=_int_field(url, answer, "commit_index"),
                        last_index=_int_field(url, answer, "last_index"))
    # Raft keeps commit <= last index on every node: a status that says
    # otherwise is not one to cut at.
    if report.commit_index > report.last_index:
        raise CutError(f"{url}: commit index {report.commit_index} is beyond the node's last "
                       f"index {report.last_index}")
    return report


def choose(reports: Sequence[NodeReport]) -> dict[str, GroupCut]:
    """Per group, the highest commit index reported (see the module's docstring)."""
    by_node: dict[tuple[str, int], NodeReport] = {}
    for report in reports:
        other = by_node.get((report.group, report.node_id))
        if other is not None:
            raise CutError(f"{other.url} and {report.url} both answer for node "
                           f"{report.node_id} of group {report.group}")
        by_node[(report.group, report.node_id)] = report
    groups: dict[str, list[NodeReport]] = {}
    for report in reports:
        groups.setdefault(report.group, []).append(report)
    cuts = {}
    for name, nodes in groups.items():
        nodes.sort(key=lambda r: r.node_id)
        best = max(nodes, key=lambda r: (r.commit_index, r.role == "leader", r.term))
        leaders = [r for r in nodes if r.role == "leader"]
        leader = max(leaders, key=lambda r: r.term) if leaders else None
        if leader is best:
            source = f"n{best.node_id} (leader, term {best.term})"
        elif leader is not None:
            source = (f"n{best.node_id} (the leader n{leader.node_id} of term {leader.term} "
                      f"reports {leader.commit_index})")
        else:
            source = f"n{best.node_id} (no leader answered)"
        cuts[name] = GroupCut(name, best.commit_index, source, tuple(nodes))
    return cuts


async def _ask(url: str, to: Target, credentials: Any, timeout: float) -> NodeReport:
    from ledgermq.client.admin import AdminApi
    from ledgermq.webadmin.app import AdminApiError

    try:
        async with AdminApi(url, credentials=credentials, token=to.token,
                            ca_file=to.tls_ca_file, timeout=timeout) as api:
            answer = await api.call("GET", "status")
    except AdminApiError as exc:
        if exc.status == 0:
            reason = str(exc).removeprefix(f"{exc.status} {exc.code}: ")
            raise CutError(f"{url}: the broker did not answer ({reason})") from None
        if exc.status == 404:  # a NameServer's admin app, or something else
            raise CutError(f"{url}: no /api/v1/status here (404): {NOT_BROKER}") from None
        raise CutError(f"{url}: /api/v1/status answered {exc}") from None
    except (TimeoutError, OSError) as exc:  # aiohttp's total timeout is a TimeoutError
        raise CutError(f"{url}: the broker did not answer within {timeout:g} s "
                       f"({type(exc).__name__})") from None
    return parse_status(url, answer)


async def capture_async(urls: Sequence[str], to: Target, timeout: float = 10.0) -> LiveCut:
    """`capture` on the running event loop."""
    from ledgermq.client.admin import load_credentials

    if not urls:
        raise CutError("no admin URL given: name every broker's admin API")
    if len(set(urls)) != len(urls):
        raise CutError(f"an admin URL is given twice: {sorted(urls)}")
    try:
        credentials = load_credentials(to.access_key, to.secret_file)
    except ValueError as exc:  # SecretFileError included
        raise CutError(f"credentials: {exc}") from None
    results = await asyncio.gather(*(_ask(url, to, credentials, timeout) for url in urls),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        # Every failure at once: an operator fixing a list of URLs wants all of them.
        for error in errors:
            if not isinstance(error, CutError):
                raise error
        raise CutError("; ".join(str(e) for e in errors))
    return LiveCut(choose([r for r in results if isinstance(r, NodeReport)]))


def capture(urls: Sequence[str], to: Target, timeout: float = 10.0) -> LiveCut:
    """Ask every broker admin URL in `urls` for its status (as `to` says:
    credentials, token, CA) and return each group's cut; CutError otherwise."""
    from ledgermq.base import loop

    return loop.run(capture_async(list(urls), to, timeout))


def split_urls(values: Sequence[str]) -> list[str]:
    """Admin URLs given as options: repeatable, each comma or space separated."""
    return [url for value in values for url in value.replace(",", " ").split()]


def live_cuts(urls: Sequence[str], explicit: Sequence[str], to: Target) -> list[str]:
    """`ledgermq audit --live`: the `--cut GROUP=INDEX` values to audit with,
    the captured ones added to those given. Says on stderr where each came
    from; a cut that cannot be captured, or a group cut both ways, ends the
    command with exit status 2 (its inputs could not be read)."""
    given = {value.split("=", 1)[0] for value in explicit}
    try:
        live = capture(urls, to)
    except CutError as exc:
        typer.echo(f"audit: no live cut: {exc}", err=True)
        raise typer.Exit(2) from None
    both = sorted(given & set(live.groups))
    if both:
        typer.echo(f"audit: --cut and --live both cut {', '.join(both)}: give one", err=True)
        raise typer.Exit(2)
    typer.echo(f"audit: live cut {live.describe()}", err=True)
    return [*explicit, *(f"{name}={index}" for name, index in live.indexes.items())]


def register(audit_app: Any) -> None:
    """Add `cut` to the `ledgermq audit` command group."""
    @audit_app.command("cut")
    def cut(
        urls: Annotated[list[str], typer.Argument(help="every broker's admin URL")],
        timeout: Annotated[float, typer.Option(
            min=0.1, help="seconds each broker has to answer")] = 10.0,
        access_key: str = ACCESS_KEY_OPTION,
        secret_file: str = SECRET_FILE_OPTION,
        token: str = TOKEN_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Print the live cut (`--cut GROUP=INDEX ...`) the brokers' commit
        indexes give; where each came from on stderr."""
        from ledgermq.cli.errors import fail

        try:
            live = capture(urls, Target("", access_key, secret_file, token, tls_ca_file),
                           timeout)
        except CutError as exc:
            raise fail(str(exc)) from None
        typer.echo(" ".join(live.cut_args()))
        typer.echo(f"cut: {live.describe()}", err=True)
