"""A throwaway Spark standalone cluster on this machine: one master, N workers.

For the tests (``test_standalone``) and the benchmark (``bench/audit.py
--standalone``): each daemon is a separate JVM started with the pyspark
distribution's ``bin/spark-class`` (``org.apache.spark.deploy.master.Master``,
``org.apache.spark.deploy.worker.Worker``), bound to 127.0.0.1 on free
ports, with its own work and log directory under ``work``; ``cluster``
stops every process it started, by PID (each in its own session, so a
worker's executors go with it), whatever happens. A real deployment starts
the same daemons on its machines (docs/audit.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def env() -> dict[str, str]:
    """The environment of the daemons and of spark-submit: loopback, this interpreter."""
    e = dict(os.environ)
    e.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
             PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
             SPARK_NO_DAEMONIZE="1")
    return e


@dataclass
class Cluster:
    url: str
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def log_text(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs
                         if p.exists())


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: exited with {proc.returncode} before '{text}'")
        time.sleep(0.2)
    raise TimeoutError(f"{path.name}: no '{text}' within {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the daemon's own session: it and its executors
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


@contextlib.contextmanager
def cluster(work: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
            ) -> Iterator[Cluster]:
    """Start a master and ``workers`` workers; yield the cluster; stop them all."""
    cls = str(spark_home() / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = work / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            p = subprocess.Popen([cls, *args], stdout=out, stderr=subprocess.STDOUT,
                                 env=env(), cwd=work, start_new_session=True)
        procs.append(p)
        return p

    c = Cluster(url, procs, logs)
    try:
        master = start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                  "--port", str(port), "--webui-port", str(free_port())])
        _wait_for(work / "master.log", "I have been elected leader", master, 60)
        started = []
        for i in range(workers):
            d = work / f"worker{i}"
            d.mkdir()
            started.append(start(f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                str(cores), "--memory", memory, "--work-dir", str(d), "--webui-port",
                str(free_port()), url]))
        for i, w in enumerate(started):
            _wait_for(work / f"worker{i}.log", "Successfully registered with master", w, 60)
        yield c
    finally:
        for p in reversed(procs):
            _stop(p)
