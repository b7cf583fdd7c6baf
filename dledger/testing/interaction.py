"""Interaction-transcript environment (etcd's rafttest style) for scripted Raft scenarios.

A transcript is a text file of blocks separated by blank lines:

    # optional comment lines
    command arg arg key=value
    ----
    expected output

`InteractionEnv.handle(line)` runs one command and returns its output; the
test runner (`tests/dledger/test_interactions.py`) compares it with the file
and, with LEDGERMQ_REWRITE=1, rewrites the file instead. Nodes persist
synchronously here (a Ready is written, then its messages are queued), so a
transcript shows protocol decisions, not disk timing; the simulator covers
the latter.

Commands (`deliver-msgs [ids] [from=ids] [drop=ids]` filters by recipient and
sender, or drops): add-nodes, campaign, tick, propose, process-ready, deliver-msgs,
stabilize, isolate, partition, heal, crash, restart, transfer-leadership,
status, log, compact (`compact 1 5`: node 1's storage drops entries <= 5, or
<= its applied index without a number) and report-snapshot (`report-snapshot
1 3 ok|fail`: the leader hears how the transfer to 3 went). A Ready's
snapshot is installed into the node's storage before its entries.

Membership: `add-nodes N identity=true segment=4096` (CONFIG entries
outgrow the default 256-byte segments) gives node n the data-directory id
100 * n + 1 (each wipe adds one); `add-node 4` starts an extra node outside
the bootstrap configuration; `member 1 add-learner|promote|remove|rejoin 4
[unpinned]` asks node 1 to propose that change; `wipe 3` restarts node 3 on
empty storage under a new directory id; `membership [ids]` prints each
node's configuration in effect. CONFIG entries print as `CONF v=1@101,2 l=4`
(voters, learners, @ the pinned directory); vote messages print the
sender's directory id when it has one.

`leader-unreachable 3 1` tells node 3 that every connection to and from its
leader 1 closed (`RaftNode.leader_unreachable`); it prints `taken` or
`ignored`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dledger.config import Config
from dledger.entry import Entry, EntryKind, segment_placement
from dledger.log import UNLIMITED
from dledger.membership import (
    Member,
    Membership,
    MembershipError,
    add_learner,
    bootstrap,
    decode,
    promote,
    rejoin,
    remove,
)
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.raw_node import MembershipChangeRefused, NotLeader, RaftNode
from dledger.ready import Ready
from dledger.storage import MemoryLogStorage
from election.config import ElectionConfig

_KIND_NAMES: dict[int, str] = {
    EntryKind.MESSAGES: "MSG", EntryKind.NOOP: "NOOP", EntryKind.CONTROL: "CTRL",
    EntryKind.CONFIG: "CONF",
}


def format_membership(m: Membership) -> str:
    """`v=1@101,2 l=4`: voters, learners, each with @ its pinned directory."""

    def member(x: Member) -> str:
        return f"{x.node_id}@{x.directory_id}" if x.directory_id else str(x.node_id)

    text = "v=" + ",".join(member(x) for x in m.voters)
    if m.learners:
        text += " l=" + ",".join(member(x) for x in m.learners)
    return text


def format_entry(entry: Entry) -> str:
    text = f"{entry.index}/{entry.term} {_KIND_NAMES.get(entry.kind, entry.kind)}@{entry.position}"
    if entry.kind == EntryKind.CONFIG:
        text += " " + format_membership(decode(entry.data))
    elif entry.data:
        text += f" {entry.data.decode(errors='replace')!r}"
    return text


def format_message(msg: Message) -> str:
    head = f"{msg.src}->{msg.dst}"
    if isinstance(msg, VoteRequest):
        name = "PreVote" if msg.pre_vote else "Vote"
        extra = " transfer" if msg.transfer else ""
        extra += f" dir={msg.directory_id}" if msg.directory_id else ""
        return f"{head} {name} term={msg.term} last={msg.last_index}/{msg.last_term}{extra}"
    if isinstance(msg, VoteResponse):
        name = "PreVoteResp" if msg.pre_vote else "VoteResp"
        extra = f" dir={msg.directory_id}" if msg.directory_id else ""
        return (f"{head} {name} term={msg.term} {'granted' if msg.granted else 'rejected'}"
                f"{extra}")
    if isinstance(msg, AppendRequest):
        entries = ", ".join(format_entry(e) for e in msg.entries)
        return (
            f"{head} App term={msg.term} prev={msg.prev_index}/{msg.prev_term} "
            f"commit={msg.commit} [{entries}]"
        )
    if isinstance(msg, AppendResponse):
        if msg.success:
            return f"{head} AppResp term={msg.term} ok index={msg.index}"
        return (
            f"{head} AppResp term={msg.term} reject index={msg.index} "
            f"hint={msg.hint_index}/{msg.hint_term}"
        )
    if isinstance(msg, Heartbeat):
        return f"{head} Heartbeat term={msg.term} commit={msg.commit}"
    if isinstance(msg, HeartbeatResponse):
        return f"{head} HeartbeatResp term={msg.term}"
    if isinstance(msg, TimeoutNow):
        return f"{head} TimeoutNow term={msg.term}"
    if isinstance(msg, InstallSnapshot):
        return (f"{head} InstallSnapshot term={msg.term} "
                f"snap={msg.index}/{msg.snap_term}@{msg.end_position}")
    return f"{head} {msg!r}"


def _flag(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


class InteractionEnv:
    """A small cluster driven command by command, printing what each node does."""

    def __init__(self) -> None:
        self.nodes: dict[int, RaftNode | None] = {}
        self.storages: dict[int, MemoryLogStorage] = {}
        self.queue: list[Message] = []
        self.blocked: set[tuple[int, int]] = set()
        self._config: dict[str, int | bool] = {}
        self._out: list[str] = []
        self._commands: dict[str, Callable[[list[str], dict[str, str]], None]] = {
            "add-nodes": self._add_nodes,
            "campaign": lambda a, k: self._node(a[0]).campaign(),
            "tick": self._tick,
            "propose": self._propose,
            "process-ready": self._process_ready_cmd,
            "deliver-msgs": self._deliver_cmd,
            "stabilize": self._stabilize,
            "isolate": self._isolate,
            "partition": self._partition,
            "heal": lambda a, k: self.blocked.clear(),
            "crash": self._crash,
            "restart": self._restart,
            "transfer-leadership": self._transfer,
            "status": self._status,
            "log": self._log,
            "compact": self._compact,
            "report-snapshot": self._report_snapshot,
            "add-node": self._add_node,
            "member": self._member,
            "wipe": self._wipe,
            "membership": self._membership,
            "leader-unreachable": self._leader_unreachable,
        }
        # Identity: each node's data-directory id (0: not tracked).
        self.directories: dict[int, int] = {}

    # ------------------------------------------------------------- dispatch

    def handle(self, line: str) -> str:
        """Run one command line; returns its output ('ok' if it printed nothing)."""
        words = line.split()
        args = [w for w in words[1:] if "=" not in w]
        kwargs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        command = self._commands.get(words[0])
        if command is None:
            raise ValueError(f"unknown command {words[0]!r}")
        self._out = []
        command(args, kwargs)
        return "\n".join(self._out) if self._out else "ok"

    def _print(self, text: str) -> None:
        self._out.append(text)

    def _node(self, ident: str | int) -> RaftNode:
        node = self.nodes[int(ident)]
        if node is None:
            raise ValueError(f"node {ident} is down")
        return node

    def _ids(self, args: list[str]) -> list[int]:
        return [int(a) for a in args] if args else sorted(self.nodes)

    # ------------------------------------------------------------- commands

    def _add_nodes(self, args: list[str], kwargs: dict[str, str]) -> None:
        count = int(args[0])
        self._config = {
            "pre_vote": _flag(kwargs.get("pre_vote", "true")),
            "check_quorum": _flag(kwargs.get("check_quorum", "true")),
            "election_timeout": int(kwargs.get("election_timeout", "10")),
            "heartbeat": int(kwargs.get("heartbeat", "1")),
            "entries_max": int(kwargs.get("entries_max", "64")),
            "preferred": int(kwargs.get("preferred", "0")),
            "count": count,
            "identity": _flag(kwargs.get("identity", "false")),
            "segment": int(kwargs.get("segment", "256")),
        }
        for n in range(1, count + 1):
            self.storages[n] = MemoryLogStorage()
            self.directories[n] = 100 * n + 1 if self._config["identity"] else 0
            self._start(n)
        self._print(f"added nodes 1..{count}")

    def _start(self, n: int) -> None:
        c = self._config
        count = int(c["count"])
        config = Config(
            node_id=n,
            voters=frozenset(range(1, count + 1)),
            membership=bootstrap(dict.fromkeys(range(1, count + 1), "")),
            directory_id=self.directories.get(n, 0),
            election=ElectionConfig(
                election_timeout_ticks=int(c["election_timeout"]),
                heartbeat_interval_ticks=int(c["heartbeat"]),
                pre_vote=bool(c["pre_vote"]),
                check_quorum=bool(c["check_quorum"]),
                preferred_leader=int(c["preferred"]),
            ),
            append_entries_max=int(c["entries_max"]),
        )
        # Seeded per node: randomized timeouts are the same on every run.
        place = segment_placement(int(c["segment"]))
        self.nodes[n] = RaftNode(config, self.storages[n], random.Random(n), place)

    def _tick(self, args: list[str], kwargs: dict[str, str]) -> None:
        node = self._node(args[0])
        for _ in range(int(args[1]) if len(args) > 1 else 1):
            node.tick()

    def _leader_unreachable(self, args: list[str], kwargs: dict[str, str]) -> None:
        node = self._node(args[0])
        taken = node.leader_unreachable(int(args[1]))
        self._print("taken" if taken else "ignored")

    def _propose(self, args: list[str], kwargs: dict[str, str]) -> None:
        node = self._node(args[0])
        try:
            index, term = node.propose(EntryKind.MESSAGES, " ".join(args[1:]).encode())
        except NotLeader as exc:
            self._print(f"rejected: {exc}")
        else:
            self._print(f"proposed at {index}/{term}")

    def _process_ready_cmd(self, args: list[str], kwargs: dict[str, str]) -> None:
        for n in self._ids(args):
            self._process_ready(n)

    def _process_ready(self, n: int) -> bool:
        node = self.nodes[n]
        if node is None or not node.has_ready():
            return False
        ready = node.ready()
        self._print(f"> {n} handling Ready")
        for line in self._describe_ready(ready):
            self._print("  " + line)
        storage = self.storages[n]
        if ready.snapshot is not None:
            storage.install(ready.snapshot)
        storage.append(ready.entries)
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)
        # Persistence is synchronous here, so both message kinds go out now.
        self.queue.extend(ready.messages)
        self.queue.extend(ready.messages_after_persist)
        node.advance(ready)
        return True

    @staticmethod
    def _describe_ready(ready: Ready) -> list[str]:
        lines = []
        if ready.snapshot is not None:
            snap = ready.snapshot
            lines.append(f"Snapshot: {snap.index}/{snap.term}@{snap.end_position}")
        if ready.soft_state is not None:
            s = ready.soft_state
            lines.append(f"Role: {s.role.name} term={s.term} leader={s.leader_id}")
        if ready.hard_state is not None:
            h = ready.hard_state
            sync = " (sync)" if ready.must_sync else ""
            lines.append(f"HardState term={h.term} vote={h.vote} commit={h.commit}{sync}")
        if ready.entries:
            lines.append("Entries: " + ", ".join(format_entry(e) for e in ready.entries))
        for msg in ready.messages:
            lines.append("Send: " + format_message(msg))
        for msg in ready.messages_after_persist:
            lines.append("Send after persist: " + format_message(msg))
        if ready.committed_entries:
            committed = ", ".join(format_entry(e) for e in ready.committed_entries)
            lines.append("Committed: " + committed)
        return lines

    def _deliver_cmd(self, args: list[str], kwargs: dict[str, str]) -> None:
        drop = {int(x) for x in kwargs.get("drop", "").split(",") if x}
        senders = {int(x) for x in kwargs.get("from", "").split(",") if x} or None
        self._deliver(set(self._ids(args)), drop, senders)

    def _deliver(
        self, recipients: set[int], drop: set[int], senders: set[int] | None = None
    ) -> bool:
        """Deliver queued messages to `recipients` (only from `senders` if given)."""

        def wanted(m: Message) -> bool:
            return m.dst in recipients and (senders is None or m.src in senders)

        due = [m for m in self.queue if wanted(m)]
        self.queue = [m for m in self.queue if not wanted(m)]
        for msg in due:
            node = self.nodes.get(msg.dst)
            if msg.dst in drop or (msg.src, msg.dst) in self.blocked or node is None:
                self._print(f"dropped: {format_message(msg)}")
                continue
            self._print(format_message(msg))
            node.step(msg)
        return bool(due)

    def _stabilize(self, args: list[str], kwargs: dict[str, str]) -> None:
        ids = self._ids(args)
        for _ in range(1000):
            progressed = False
            for n in ids:
                progressed |= self._process_ready(n)
            progressed |= self._deliver(set(ids), set())
            if not progressed:
                return
        raise RuntimeError("stabilize did not settle in 1000 rounds")

    def _isolate(self, args: list[str], kwargs: dict[str, str]) -> None:
        n = int(args[0])
        for m in self.nodes:
            if m != n:
                self.blocked |= {(n, m), (m, n)}

    def _partition(self, args: list[str], kwargs: dict[str, str]) -> None:
        groups = [{int(x) for x in group.split(",")} for group in args]
        self.blocked = {
            (a, b) for ga in groups for gb in groups if ga is not gb for a in ga for b in gb
        }

    def _crash(self, args: list[str], kwargs: dict[str, str]) -> None:
        n = int(args[0])
        self.nodes[n] = None
        self.queue = [m for m in self.queue if m.dst != n and m.src != n]

    def _restart(self, args: list[str], kwargs: dict[str, str]) -> None:
        self._start(int(args[0]))

    def _transfer(self, args: list[str], kwargs: dict[str, str]) -> None:
        ok = self._node(args[0]).transfer_leadership(int(args[1]))
        self._print("transfer started" if ok else "transfer refused")

    def _status(self, args: list[str], kwargs: dict[str, str]) -> None:
        for n in self._ids(args):
            node = self.nodes[n]
            if node is None:
                self._print(f"{n}: down")
                continue
            s = node.status()
            line = (
                f"{n}: {s.role.name} term={s.term} vote={s.vote} leader={s.leader_id} "
                f"last={s.last_index}/{s.last_term} commit={s.commit_index} "
                f"applied={s.applied_index}"
            )
            if s.first_index > 1:
                line += f" first={s.first_index}"
            for peer, pr in s.progress.items():
                line += f" | {peer}:{pr.state} match={pr.match} next={pr.next}"
                if pr.pending_snapshot:
                    line += f" snap={pr.pending_snapshot}"
                if pr.learner:
                    line += " learner"
                if pr.identity_mismatch:
                    line += f" identity-mismatch(dir={pr.directory_id})"
            self._print(line)

    def _log(self, args: list[str], kwargs: dict[str, str]) -> None:
        node = self._node(args[0])
        first = node.log.first_index()
        entries = node.log.entries(first, node.log.last_index + 1, UNLIMITED, UNLIMITED)
        lines = [f"snapshot {first - 1}/{node.log.term(first - 1)}"] if first > 1 else []
        lines += [format_entry(e) for e in entries]
        self._print("\n".join(lines) or "(empty)")

    def _compact(self, args: list[str], kwargs: dict[str, str]) -> None:
        n = int(args[0])
        index = int(args[1]) if len(args) > 1 else self._node(n).applied
        meta = self.storages[n].compact(index)
        self._print(f"{n} compacted to {meta.index}/{meta.term}@{meta.end_position}")

    def _report_snapshot(self, args: list[str], kwargs: dict[str, str]) -> None:
        self._node(args[0]).report_snapshot(int(args[1]), args[2] == "ok")

    # ------------------------------------------------------------- membership

    def _add_node(self, args: list[str], kwargs: dict[str, str]) -> None:
        n = int(args[0])
        if n in self.nodes:
            raise ValueError(f"node {n} exists")
        self.storages[n] = MemoryLogStorage()
        self.directories[n] = 100 * n + 1 if self._config["identity"] else 0
        self._start(n)
        self._print(f"added node {n}" + (f" dir={self.directories[n]}"
                                          if self.directories[n] else ""))

    def _member(self, args: list[str], kwargs: dict[str, str]) -> None:
        """`member <leader> add-learner|promote|remove|rejoin <node> [unpinned]`."""
        node = self._node(args[0])
        op, target = args[1], int(args[2])
        current = node.membership
        try:
            if op == "add-learner":
                pinned = len(args) < 4 or args[3] != "unpinned"
                new = add_learner(current, Member(
                    target, "", self.directories.get(target, 0) if pinned else 0))
            elif op == "promote":
                new = promote(current, target)
            elif op == "remove":
                new = remove(current, target)
            elif op == "rejoin":
                new = rejoin(current, target, self.directories[target])
            else:
                raise ValueError(f"unknown membership operation {op!r}")
            index, term = node.propose_membership(new)
        except (MembershipError, MembershipChangeRefused) as exc:
            self._print(f"refused: {exc}")
        except NotLeader as exc:
            self._print(f"rejected: {exc}")
        else:
            self._print(f"proposed at {index}/{term}: {format_membership(new)}")

    def _wipe(self, args: list[str], kwargs: dict[str, str]) -> None:
        n = int(args[0])
        self._crash(args, kwargs)
        old = self.directories.get(n, 0)
        self.directories[n] = old + 1 if old else 0
        self.storages[n] = MemoryLogStorage()
        self._start(n)
        self._print(f"wiped {n}: directory {old} -> {self.directories[n]}, empty log")

    def _membership(self, args: list[str], kwargs: dict[str, str]) -> None:
        for n in self._ids(args):
            node = self.nodes[n]
            if node is None:
                self._print(f"{n}: down")
                continue
            pending = " pending" if node.membership_pending else ""
            self._print(f"{n}: {format_membership(node.membership)} "
                        f"index={node.membership_index}{pending}")


def parse_transcript(text: str) -> list[tuple[list[str], str, str]]:
    """Split a transcript into (comment lines, command, expected output) blocks."""
    blocks = []
    for raw in text.strip("\n").split("\n\n"):
        lines = raw.split("\n")
        comments = [line for line in lines if line.startswith("#")]
        rest = [line for line in lines if not line.startswith("#")]
        if not rest:
            continue
        if "----" not in rest:
            raise ValueError(f"block without '----': {raw!r}")
        sep = rest.index("----")
        blocks.append((comments, rest[0], "\n".join(rest[sep + 1 :])))
    return blocks


def run_transcript(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """Run every command of `text`; returns the rewritten text and (command, want, got)."""
    env = InteractionEnv()
    out_blocks = []
    results = []
    for comments, command, expected in parse_transcript(text):
        got = env.handle(command)
        results.append((command, expected, got))
        out_blocks.append("\n".join([*comments, command, "----", got]))
    return "\n\n".join(out_blocks) + "\n", results
