"""`ledgermq audit schedule`: the nightly audit of a live deployment, on a cron schedule.

A long-running service (the docker `audit` service runs it) that, at every
tick of a cron expression (`--cron`, or `LEDGERMQ_AUDIT_SCHEDULE`; parsed by
`cronsim`, in `--timezone`, UTC by default):

1. captures the live cut from the brokers' admin APIs (`audit_cut.capture`;
   every group named by the group specs must answer, and only they);
2. runs `ledgermq audit --nightly --state DIR --cut GROUP=INDEX ... SPECS` as a
   child process at **low priority**: `chrt --idle 0` (SCHED_IDLE: the
   kernel gives it a CPU only when no normal task wants one), `ionice -c 3`
   (idle I/O class) and `nice -n 19`, inherited by the JVM and the Python
   workers it starts, in a session of its own whose autogroup is set to
   nice 19 (`lower_autogroup`: with autogroup scheduling, policy and nice
   count only inside a session): the audit gets only the CPU the brokers
   leave. What it still costs a broker on the same small machine is measured
   by bench/audit_live.py (docs/audit.md, "Auditing a live deployment": half
   of what the audit at normal priority costs, more than 10% on the 2-vCPU
   development VM, where the contention is below the guest's scheduler).
   `--priority normal` turns it off, `nice` keeps all but SCHED_IDLE;
3. logs one line per night: its verdict, the cut, what was audited, where the
   child's own output went (`DIR/logs/<night>.log`, the newest 30 kept).

A night that fails (no cut, an audit that exits 1 or 2, a crash) is logged
and the service waits for the next tick. SIGTERM or SIGINT stops it: a
running audit gets SIGTERM (its process group: the JVM with it), then
SIGKILL after `STOP_GRACE_S`; the service exits 0. Ticks that pass while a
night runs are skipped, not queued. `--run-at-start` runs a night at once;
`--nights N` stops after N nights with the last night's exit status
(tests, one-off runs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from ledgermq.base.stop_flag import StopFlag, stop_on_signals
from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    Target,
)

PRIORITIES = ("idle", "nice", "normal")
STOP_GRACE_S = 20.0
LOGS_KEPT = 30
# Longest single sleep: the wall clock is read again after it, so a clock
# step or a suspended host delays a tick by at most this much.
MAX_SLEEP_S = 30.0


class ScheduleError(ValueError):
    """The schedule cannot run: a bad cron expression, time zone or option."""


@dataclass
class ScheduleConfig:
    """What `ledgermq audit schedule` was told."""

    cron: str
    live: list[str]
    state: str
    specs: list[str]
    target: Target = field(default_factory=Target)
    timezone: str = "UTC"
    master: str = "local[2]"
    engine: str = "spark"
    driver_memory: str = "1g"
    priority: str = "idle"
    audit_args: list[str] = field(default_factory=list)
    run_at_start: bool = False
    nights: int = 0  # stop after this many nights; 0: run until SIGTERM
    capture_timeout: float = 10.0


def zone(name: str) -> dt.tzinfo:
    """A time zone by IANA name ("UTC" needs no tz database)."""
    if name.upper() == "UTC":
        return dt.UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"unknown time zone {name!r}: {exc}") from None


def next_tick(cron: str, after: dt.datetime) -> dt.datetime:
    """The first time strictly after `after` (tz-aware) that `cron` names:
    five fields (minute hour day-of-month month day-of-week), or six with the
    seconds first (`*/20 * * * * *`: every 20 s, for tests)."""
    from cronsim import CronSim, CronSimError

    if after.tzinfo is None:
        raise ValueError("next_tick needs a time zone aware datetime")
    try:
        return next(CronSim(cron, after))
    except CronSimError as exc:
        raise ScheduleError(f"bad cron expression {cron!r}: {exc}") from None
    except StopIteration:  # e.g. "0 0 30 2 *": February 30th never comes
        raise ScheduleError(f"cron expression {cron!r} never fires") from None


def priority_prefix(priority: str) -> list[str]:
    """The command prefix that lowers a child's CPU and I/O priority."""
    if priority not in PRIORITIES:
        raise ScheduleError(f"--priority must be one of {', '.join(PRIORITIES)}")
    if priority == "normal":
        return []
    needed = ["ionice", "nice"] + (["chrt"] if priority == "idle" else [])
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        raise ScheduleError(f"--priority {priority} needs {', '.join(missing)} on PATH "
                            "(util-linux, coreutils)")
    prefix = ["chrt", "--idle", "0"] if priority == "idle" else []
    return [*prefix, "ionice", "-c", "3", "nice", "-n", "19"]


def lower_autogroup(pid: int) -> bool:
    """Set the autogroup of `pid`'s session to nice 19; False where the
    kernel has no autogroup scheduling (or refuses).

    With `kernel.sched_autogroup_enabled` (the default of most distributions'
    kernels) the CPU is shared first between sessions, each an equal group,
    and only then by nice and policy inside a session: an audit in a session
    of its own would get as much CPU as a broker's session however idle its
    processes' policy. Its session's group at nice 19 weighs 15 against a
    broker's 1024 (measured: docs/audit.md, "Auditing a live deployment").
    The nice of an autogroup applies to every process of the session at
    once, the ones started before too."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as group:
            group.write("19")
    except OSError:  # no such file: no autogroup; EPERM, ESRCH: it stays as it is
        return False
    return True


def spawn(command: Sequence[str], priority: str, **popen: Any) -> subprocess.Popen[bytes]:
    """Start `command` in a session of its own (its process group: the JVM
    and the Python workers go with it on a stop) at `priority`."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(
        [*priority_prefix(priority), *command], start_new_session=True, **popen)
    if priority != "normal":
        lower_autogroup(proc.pid)
    return proc


def spec_groups(specs: Sequence[str]) -> set[str]:
    """The groups the specs name, as the audit will find them."""
    from spark_audit.inputs import parse_group_specs

    return {replica.group for replica in parse_group_specs(list(specs))}


def stamp(at: float) -> str:
    """A night's label: its UTC start, `YYYYMMDDTHHMMSSZ` (the state layout's)."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def read_night(state: str, since: float) -> dict[str, Any] | None:
    """The night the audit just wrote (`latest.json`, started at or after
    `since`), or None when there is none; anything malformed is None too:
    the log line then says the audit left no result."""
    try:
        night = json.loads((Path(state) / "latest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(night, dict):
        return None
    started = night.get("started")
    if not isinstance(started, (int, float)) or started < since - 1.0:
        return None  # an older night's: this one wrote nothing
    return night


def night_line(label: str, exit_code: int, night: dict[str, Any] | None, cut: str,
               seconds: float, log: str) -> str:
    """The one line a night logs."""
    verdict = {0: "PASSED", 1: "FAILED", 2: "UNREADABLE"}.get(exit_code, "CRASHED")
    head = f"night {label}: {verdict} (exit {exit_code}) in {seconds:.1f} s; cut {cut}"
    if night is None:
        return f"{head}; the audit left no result; output in {log}"
    try:
        findings = night.get("findings") or {}
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(findings.items()))
        return (f"{head}; night {night['night']}: {int(night['entries_audited']):,} entries, "
                f"{_size(int(night['bytes_audited']))} audited, "
                f"{int(night['violations'])} violations" + (f" ({kinds})" if kinds else "")
                + f"; output in {log}")
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"{head}; its night.json is malformed; output in {log}"


class Scheduler:
    """The service loop; `run()` returns the exit status."""

    def __init__(self, config: ScheduleConfig, out: Any = None) -> None:
        self.cfg = config
        self.out = out or sys.stdout
        self.tz = zone(config.timezone)
        next_tick(config.cron, dt.datetime.now(self.tz))  # a bad expression fails now
        self.prefix = priority_prefix(config.priority)
        if not config.live:
            raise ScheduleError("name every broker's admin URL with --live "
                                "(or LEDGERMQ_AUDIT_LIVE)")
        if not config.specs:
            raise ScheduleError("give the replicas' directories (group specs) to audit")
        # Set by SIGTERM or SIGINT while `run` runs (a StopFlag: no lock
        # taken); made by `run`, which closes its pipe when it returns.
        self.stop: StopFlag | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.nights_run = 0
        self.last_exit = 0

    def log(self, text: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{now} audit-schedule: {text}", file=self.out, flush=True)

    def _stop_child(self, signum: int) -> None:
        """After a stop signal, in its handler: nothing here may wait for a
        lock (Popen.poll only tries its own)."""
        child = self.child
        if child is not None and child.poll() is None:
            # The audit's whole process group: the JVM and the Python workers too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)

    def run(self) -> int:
        with StopFlag() as stop, stop_on_signals(stop, also=self._stop_child):
            self.stop = stop
            first = dt.datetime.now(self.tz)
            self.log(f"cron {self.cfg.cron!r} ({self.cfg.timezone}), next night at "
                     f"{next_tick(self.cfg.cron, first).isoformat()}"
                     + ("; one night now (--run-at-start)" if self.cfg.run_at_start else "")
                     + f"; state {self.cfg.state}; priority {self.cfg.priority}")
            if self.cfg.run_at_start:
                self.night()
            while not stop.requested and not self._done():
                tick = next_tick(self.cfg.cron, dt.datetime.now(self.tz))
                if not self._sleep_until(tick):
                    break
                self.night()
        if self.cfg.nights and self.nights_run >= self.cfg.nights:
            return self.last_exit
        self.log(f"stopped after {self.nights_run} nights")
        return 0

    def _done(self) -> bool:
        return bool(self.cfg.nights) and self.nights_run >= self.cfg.nights

    def _sleep_until(self, tick: dt.datetime) -> bool:
        """False when told to stop first."""
        stop = self.stop
        assert stop is not None, "run() sleeps"
        while not stop.requested:
            left = (tick - dt.datetime.now(self.tz)).total_seconds()
            if left <= 0:
                return True
            stop.wait(min(left, MAX_SLEEP_S))
        return False

    def night(self) -> int:
        """One night: cut, audit, one line. Its exit status (2: not run)."""
        started = time.time()
        label = stamp(started)
        self.nights_run += 1
        exit_code = self._night(started, label)
        self.last_exit = exit_code
        return exit_code

    def _night(self, started: float, label: str) -> int:
        from ledgermq.cli.audit_cut import CutError, capture

        cfg = self.cfg
        try:
            wanted = spec_groups(cfg.specs)
        except (ValueError, OSError) as exc:
            self.log(f"night {label}: NOT RUN: the replicas' directories: {exc}")
            return 2
        try:
            cut = capture(cfg.live, cfg.target, cfg.capture_timeout)
        except CutError as exc:
            self.log(f"night {label}: NOT RUN: no live cut: {exc}")
            return 2
        if set(cut.groups) != wanted:
            # A group read without a cut would be judged on files being written.
            self.log(f"night {label}: NOT RUN: the brokers answered for groups "
                     f"{sorted(cut.groups)}, the directories hold {sorted(wanted)}")
            return 2
        logs = Path(cfg.state) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{label}.log"
        command = [sys.executable, "-m", "ledgermq.cli", "audit", "--nightly",
                   "--state", cfg.state, *cut.cut_args(), "--master", cfg.master,
                   "--engine", cfg.engine, "--driver-memory", cfg.driver_memory,
                   "--no-progress", *cfg.audit_args, *cfg.specs]
        with open(log_path, "wb") as log_file:
            log_file.write(f"# {' '.join([*self.prefix, *command])}\n"
                           f"# cut: {cut.describe()}\n".encode())
            log_file.flush()
            try:
                self.child = spawn(command, cfg.priority, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as exc:
                self.log(f"night {label}: NOT RUN: cannot start the audit: {exc}")
                return 2
            exit_code = self._wait_child(self.child)
            self.child = None
        self._prune(logs)
        night = read_night(cfg.state, started)
        self.log(night_line(label, exit_code, night, cut.describe(), time.time() - started,
                            str(log_path)))
        return exit_code

    def _wait_child(self, child: subprocess.Popen[bytes]) -> int:
        """The child's exit status; after a stop request SIGKILL follows
        SIGTERM once STOP_GRACE_S has passed."""
        stop_seen: float | None = None
        while True:
            try:
                code = child.wait(timeout=1.0)
                return code if code >= 0 else 128 - code  # killed by a signal
            except subprocess.TimeoutExpired:
                pass
            if self.stop is not None and self.stop.requested:
                stop_seen = stop_seen or time.monotonic()
                if time.monotonic() - stop_seen > STOP_GRACE_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)

    @staticmethod
    def _prune(logs: Path) -> None:
        for old in sorted(logs.glob("*.log"))[:-LOGS_KEPT]:
            old.unlink(missing_ok=True)


def register(audit_app: Any) -> None:
    """Add `schedule` to the `ledgermq audit` command group."""
    @audit_app.command("schedule")
    def schedule(
        specs: Annotated[list[str], typer.Argument(
            envvar="LEDGERMQ_AUDIT_SPECS",
            help="the replicas' directories: NAME=DIR,DIR,... or ROOT/<group>/<node>/")],
        cron: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_SCHEDULE",
            help="when to audit: a cron expression, e.g. '30 2 * * *' (6 fields: seconds "
                 "first)")] = "30 2 * * *",
        live: Annotated[list[str], typer.Option(
            envvar="LEDGERMQ_AUDIT_LIVE",
            help="every broker's admin URL (repeatable or comma separated): the live cut "
                 "is asked of them")] = [],  # noqa: B006 (Typer reads the default)
        state: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_STATE", help="the nightly state directory")] = "audit-state",
        timezone: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_TIMEZONE", help="time zone of the cron expression")] = "UTC",
        master: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_MASTER", help="Spark master URL")] = "local[2]",
        engine: Annotated[str, typer.Option(help="spark, or python")] = "spark",
        driver_memory: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_DRIVER_MEMORY", help="Spark driver memory")] = "1g",
        priority: Annotated[str, typer.Option(
            envvar="LEDGERMQ_AUDIT_PRIORITY",
            help="idle (SCHED_IDLE, idle I/O, nice 19), nice (nice 19, idle I/O) or "
                 "normal")] = "idle",
        audit_arg: Annotated[list[str], typer.Option(
            help="one more argument for `ledgermq audit --nightly` (repeatable)")
        ] = [],  # noqa: B006
        run_at_start: Annotated[bool, typer.Option(
            envvar="LEDGERMQ_AUDIT_RUN_AT_START", help="run one night at once")] = False,
        nights: Annotated[int, typer.Option(
            min=0, help="stop after this many nights (0: until SIGTERM)")] = 0,
        capture_timeout: Annotated[float, typer.Option(
            min=0.1, help="seconds each broker has to answer for the cut")] = 10.0,
        access_key: str = ACCESS_KEY_OPTION,
        secret_file: str = SECRET_FILE_OPTION,
        token: str = TOKEN_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Audit the live deployment on a cron schedule: capture the cut, run
        `audit --nightly` at low priority, log one line per night."""
        from ledgermq.cli import audit_cut
        from ledgermq.cli.errors import fail

        config = ScheduleConfig(
            cron=cron, live=audit_cut.split_urls(live), state=state, specs=list(specs),
            target=Target("", access_key, secret_file, token, tls_ca_file),
            timezone=timezone, master=master, engine=engine, driver_memory=driver_memory,
            priority=priority, audit_args=list(audit_arg), run_at_start=run_at_start,
            nights=nights, capture_timeout=capture_timeout)
        try:
            scheduler = Scheduler(config)
        except ScheduleError as exc:
            raise fail(str(exc)) from None
        raise typer.Exit(scheduler.run())
