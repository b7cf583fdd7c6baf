"""Which tests must share one pytest-xdist worker when `make test` runs the
suite in parallel (`pytest -n N --dist loadgroup`).

Most of the suite waits on real clusters, sockets and fsyncs: run one test at
a time, the 2-core CI machine sits 60% idle. `make test` therefore spreads the
tests over a few worker processes. A tier whose tests share something that
exists once per process goes to one worker as a group, so that it is made
once, not once per worker:

- tests/docker: the images (built once per session) and the docker host's
  networks and disk, which the fixtures budget for one deployment at a time;
- tests/spark_audit: the session's SparkSession (a JVM, ~10 s to start);
- tests/ops and tests/ledgermq/cli: the running 3-node groups their
  session fixtures start.

Elsewhere, a module whose tests use a module-scoped fixture (a cluster, a
secured arena with its workload) is a group of its own: spread over the
workers, each worker would start the fixture again, and a test that checks
what the module's earlier tests did to it (tests/security/test_attacks.py's
last test: "after every attack") would see only its own worker's share.
Every other test goes to whichever worker is free.

Run without `-n` (plain `pytest`), the marks change nothing.

Every JVM the tests start (the Spark sessions, spark-submit, a standalone
cluster's master and workers, their executors) compiles with the client
compiler only (`-XX:TieredStopAtLevel=1`, through JAVA_TOOL_OPTIONS unless
it is set already). The tests' JVMs live seconds on small data, where the
optimizing compiler's threads cost more CPU than they save: measured on
this 2-core machine, the standalone-cluster test took 107 CPU-seconds with
it and 71-76 without, the whole Spark tier 213 and 167. The product's own
JVMs (a nightly audit of millions of entries) keep the JVM's default.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
GROUPS = {
    "docker": TESTS / "docker",
    "spark": TESTS / "spark_audit",
    "ops": TESTS / "ops",
    "cli": TESTS / "ledgermq" / "cli",
}


def group_of(path: Path) -> str | None:
    """The worker group of a test file, or None: any worker may run it."""
    for name, folder in GROUPS.items():
        if path.is_relative_to(folder):
            return name
    return None


def uses_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture made once per module."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the test's fixtures
    if info is None:
        return False
    return any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


# tryfirst: pytest-xdist's own hook (xdist/remote.py) reads the xdist_group
# marks to put each group on one worker; run after it (as this hook did
# until 2026-12-06), the marks came too late and every worker started the
# groups' session clusters and SparkSession of its own.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = group_of(Path(item.path))
        if name is None and uses_module_fixture(item):
            name = Path(item.path).relative_to(TESTS).as_posix()
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))


def xdist_can_group() -> bool:
    """Whether pytest-xdist's loadgroup can work with this pytest: xdist (3.8)
    puts a test in its group by appending "@group" to `item._nodeid`, and
    schedules by `item.nodeid`; pytest 9.2 derives `nodeid` from another
    field, so the groups are spread over every worker in silence."""
    probe = type("Probe", (), {"_nodeid": "t.py::x@g", "_id": "t.py::x"})()
    return bool(pytest.Item.nodeid.fget(probe) == "t.py::x@g")  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup" and not xdist_can_group():
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks pytest-xdist's --dist loadgroup (item.nodeid"
            " no longer reads the group xdist appends): install the pytest pyproject.toml"
            " pins (make setup), or run without -n")
