"""`ledgermq audit schedule` (ledgermq/cli/audit_schedule.py).

The cron arithmetic on fixed times (five and six fields, a time zone with a
daylight-saving change, expressions that are wrong or never fire); the
night's log line from real night files, malformed and stale ones included.
Then the service as a user runs it, a real subprocess: against a broker
that does not answer, every night fails, is logged, and the service goes on
until SIGTERM stops it cleanly; against the folder's live cluster, one night
(`--run-at-start --nights 1`) audits the group up to the live cut while a
producer writes, in a child seen running at SCHED_IDLE, nice 19, the idle
I/O class and in a session whose autogroup is at nice 19, and logs one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ops.support import OpsCluster

from ledgermq.base import loop
from ledgermq.broker.launcher import REPO, node_status, wait_leader
from ledgermq.cli.audit_schedule import (
    ScheduleError,
    next_tick,
    night_line,
    priority_prefix,
    read_night,
    zone,
)
from ledgermq.client.producer import Producer

pytestmark = [pytest.mark.timeout(180)]

UTC = dt.UTC


def at(text: str, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=tz)


def test_next_tick() -> None:
    assert next_tick("30 2 * * *", at("2026-11-24T02:29:59")) == at("2026-11-24T02:30:00")
    # Strictly after: a night that starts on its tick does not run twice.
    assert next_tick("30 2 * * *", at("2026-11-24T02:30:00")) == at("2026-11-25T02:30:00")
    assert next_tick("*/20 * * * * *", at("2026-11-24T02:30:01")) == at("2026-11-24T02:30:20")
    assert next_tick("0 3 * * MON", at("2026-11-24T12:00:00")) == at("2026-11-30T03:00:00")
    # In a zone with daylight saving: 02:30 does not exist on 2026-03-29 in
    # Paris; the next night is the first existing one after it.
    paris = zone("Europe/Paris")
    tick = next_tick("30 2 * * *", at("2026-03-28T03:00:00", paris))
    assert tick.astimezone(UTC) > at("2026-03-28T02:00:00")
    assert tick.date() in (dt.date(2026, 3, 29), dt.date(2026, 3, 30))
    assert zone("utc") is UTC


@pytest.mark.parametrize(("cron", "message"), [
    ("61 * * * *", "bad cron expression '61 \\* \\* \\* \\*': Bad minute"),
    ("* * *", "Wrong number of fields"),
    ("", "Wrong number of fields"),
    ("0 0 30 2 *", "never fires|Bad day-of-month"),
])
def test_bad_cron_expressions(cron: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        next_tick(cron, at("2026-11-24T00:00:00"))


def test_zone_and_priority_errors() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        zone("Mars/Olympus")
    with pytest.raises(ScheduleError, match="--priority must be one of idle, nice, normal"):
        priority_prefix("realtime")
    assert priority_prefix("normal") == []
    assert priority_prefix("nice") == ["ionice", "-c", "3", "nice", "-n", "19"]
    assert priority_prefix("idle")[:3] == ["chrt", "--idle", "0"]


NIGHT = {"format": 1, "night": "20261124T023000Z", "started": 1795487400.0,
         "finished": 1795487460.5, "duration_s": 60.5, "valid": True, "exit": 0,
         "engine": "spark", "master": "local[2]", "entries_audited": 123456,
         "bytes_audited": 98765432, "violations": 0, "findings": {}, "groups": {}}


def test_the_nights_line(tmp_path: Path) -> None:
    assert read_night(str(tmp_path), 0.0) is None  # nothing written
    (tmp_path / "latest.json").write_text(json.dumps(NIGHT))
    assert read_night(str(tmp_path), NIGHT["started"]) == NIGHT
    # An older night's latest.json is not tonight's result.
    assert read_night(str(tmp_path), NIGHT["started"] + 3600) is None
    line = night_line("20261124T023000Z", 0, NIGHT, "broker-a=5000 from n1 (leader, term 3)",
                      61.2, "/s/logs/20261124T023000Z.log")
    assert line == ("night 20261124T023000Z: PASSED (exit 0) in 61.2 s; cut broker-a=5000 from "
                    "n1 (leader, term 3); night 20261124T023000Z: 123,456 entries, 98.8 MB "
                    "audited, 0 violations; output in /s/logs/20261124T023000Z.log")
    failed = {**NIGHT, "valid": False, "exit": 1, "violations": 4,
              "findings": {"body_crc": 3, "divergent_entry": 1}}
    assert "FAILED (exit 1)" in night_line("n", 1, failed, "c", 1.0, "l")
    assert "4 violations (body_crc 3, divergent_entry 1)" in night_line("n", 1, failed, "c",
                                                                      1.0, "l")
    assert "the audit left no result" in night_line("n", 2, None, "c", 1.0, "l")
    assert "CRASHED (exit 137)" in night_line("n", 137, None, "c", 1.0, "l")
    for bad in ("[1, 2]", "{not json", json.dumps({**NIGHT, "started": "yesterday"})):
        (tmp_path / "latest.json").write_text(bad)
        assert read_night(str(tmp_path), 0.0) is None
    broken = {**NIGHT, "entries_audited": "many"}
    assert "its night.json is malformed" in night_line("n", 0, broken, "c", 1.0, "l")


def schedule(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "ledgermq.cli", "audit", "schedule", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO, start_new_session=True)


def test_failed_nights_are_logged_and_sigterm_stops_the_service(
        cluster: OpsCluster, tmp_path: Path) -> None:
    with socket.socket() as sock:  # a broker that does not answer
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    specs = "broker-a=" + ",".join(str(cluster.base / f"n{n}") for n in (1, 2, 3))
    proc = schedule("--cron", "* * * * * *", "--live", dead, "--state", str(tmp_path),
                    "--capture-timeout", "0.5", specs)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while sum("NOT RUN" in line for line in lines) < 2:  # two failed nights, and on
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines += rest.splitlines(keepends=True)
    assert proc.returncode == 0, "".join(lines)
    assert "cron '* * * * * *' (UTC), next night at" in lines[0]
    failed = [line for line in lines if "NOT RUN" in line]
    assert all(f"no live cut: {dead}: the broker did not answer" in line for line in failed), \
        "".join(lines)
    assert "audit-schedule: stopped after" in lines[-1]


# Runs the service with a far cron and sends it SIGTERM after its k'th
# executed line, for k = 1, 2, ... until a run executes fewer lines than k;
# right before a blocking call when the k'th line comes later. A trace
# function counts the lines (every line of the standard library's too).
_SIGTERM_EVERYWHERE = """
import io, os, signal, sys
from ledgermq.cli.audit_schedule import ScheduleConfig, Scheduler

k = 0
while True:
    k += 1
    sched = Scheduler(ScheduleConfig(cron="0 0 1 1 *", live=["http://127.0.0.1:1"],
                                     state=sys.argv[1], specs=["g=" + sys.argv[1]]),
                      out=io.StringIO())
    lines, sent = 0, False

    def send():
        global sent
        if not sent and callable(signal.getsignal(signal.SIGTERM)):  # the service's
            sent = True
            os.kill(os.getpid(), signal.SIGTERM)  # handled at a next bytecode

    def on_line(frame, event, arg):
        global lines
        if event == "line":
            lines += 1
            if lines >= k:
                send()
        return on_line

    def before_blocking(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in ("select", "acquire"):
            send()

    sys.settrace(on_line)
    sys.setprofile(before_blocking)
    status = sched.run()
    sys.setprofile(None)
    sys.settrace(None)
    assert sent and status == 0, (k, sent, status)
    assert "stopped after 0 nights" in sched.out.getvalue(), k
    if lines < k:
        break
print("stopped every time:", k, "runs")
"""


def test_sigterm_anywhere_in_the_service_loop_stops_it(tmp_path: Path) -> None:
    """A signal's handler runs between two bytecodes of the main thread,
    wherever that is: SIGTERM sent after each line the service runs (up to
    and into its sleep until the next night) stops it every time. The
    handler used to set a threading.Event, whose set() takes the lock that
    its wait() holds for a few lines: a SIGTERM landing there blocked the
    handler on its own thread for good (a CI run of the test above hung on
    it); this one hangs, and fails on its timeout, with that handler."""
    done = subprocess.run([sys.executable, "-c", _SIGTERM_EVERYWHERE, str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("stopped every time:"), done.stdout


def test_bad_configuration_is_refused_at_start(tmp_path: Path) -> None:
    proc = schedule("--cron", "61 * * * *", "--live", "http://127.0.0.1:1", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert out.strip().endswith("error: bad cron expression '61 * * * *': Bad minute"), out
    proc = schedule("--cron", "* * * * *", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "name every broker's admin URL with --live" in out, out


def priority_of(pid: int) -> tuple[int, int, str, str | None]:
    """(scheduling policy, nice, ionice's class, its session's autogroup
    nice or None without autogroup scheduling) of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ionice = subprocess.run(["ionice", "-p", str(pid)], capture_output=True, text=True).stdout
    group = Path(f"/proc/{pid}/autogroup")
    autogroup = group.read_text().split()[-1] if group.exists() else None
    return int(fields[38]), int(fields[16]), ionice.split(":")[0].strip(), autogroup


def test_one_night_of_the_live_cluster(cluster: OpsCluster, tmp_path: Path) -> None:
    leader = loop.run(wait_leader(cluster))
    urls = list(cluster.admin_urls().values())
    state = tmp_path / "state"
    specs = "broker-a=" + ",".join(str(cluster.base / f"n{n}") for n in (1, 2, 3))
    stop = threading.Event()

    async def produce() -> None:
        async with Producer([cluster.namesrv_address], retry_timeout=30.0,
                            name="schedule-test") as producer:
            await producer.create_topic("Scheduled", queues=2)
            while not stop.is_set():  # paced: the audit at idle priority gets the rest
                await producer.send("Scheduled", b"y" * 64)
                await asyncio.sleep(0.005)

    def commit() -> int:
        status = loop.run(node_status(cluster.client_address(leader)))
        assert status is not None
        return int(status["commit_index"])

    writer = threading.Thread(target=loop.run, args=(produce(),), daemon=True)
    writer.start()
    seen: set[tuple[int, int, str]] = set()
    try:
        time.sleep(0.5)
        before = commit()
        proc = schedule("--run-at-start", "--nights", "1", "--engine", "python",
                        "--live", ",".join(urls), "--state", str(state), specs)
        try:
            while proc.poll() is None:  # the audit child, while it runs
                for pid in children(proc.pid):
                    with contextlib.suppress(OSError, IndexError):  # it just exited
                        seen.add(priority_of(pid))
                time.sleep(0.02)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        after = commit()
    finally:
        stop.set()
        writer.join(30)
    assert proc.returncode == 0, out
    nights = [line for line in out.splitlines() if "audit-schedule: night " in line]
    assert len(nights) == 1 and ": PASSED (exit 0)" in nights[0], out
    night = json.loads((state / "latest.json").read_text())
    group = night["groups"]["broker-a"]
    assert night["valid"] and group["cut_source"] == "admin", night
    assert before < group["cut"] < after, (before, group, after)
    assert f"cut broker-a={group['cut']} from n{leader} (leader" in nights[0]
    # SCHED_IDLE is policy 5; nice 19; the idle I/O class; and where the
    # kernel shares the CPU between sessions first, the session's group at nice 19.
    autogroup = "19" if Path("/proc/self/autogroup").exists() else None
    assert (5, 19, "idle", autogroup) in seen, seen
    log = next((state / "logs").glob("*.log")).read_text()
    assert log.startswith("# chrt --idle 0 ionice -c 3 nice -n 19 ")


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found
