"""Fixtures for NameServer tests: real `ledgermq namesrv` subprocesses, stopped by PID."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from namesrv_harness import NameServerProcess, launch


@pytest.fixture
def namesrv_factory() -> Iterator[Callable[..., NameServerProcess]]:
    started: list[NameServerProcess] = []

    def factory(**kw: int) -> NameServerProcess:
        ns = launch(**kw)
        started.append(ns)
        return ns

    yield factory
    for ns in started:
        ns.stop()


@pytest.fixture
def namesrv(namesrv_factory: Callable[..., NameServerProcess]) -> NameServerProcess:
    return namesrv_factory()
