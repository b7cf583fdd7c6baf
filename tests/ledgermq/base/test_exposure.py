"""The start-up rule every port follows (ledgermq.base.exposure)."""

from __future__ import annotations

import logging

import pytest

from ledgermq.base.exposure import ExposureError, check_exposure

REMEDY = "set a secret or allow_open"


def test_loopback_without_authentication_runs_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_exposure({"client port": "127.0.0.1", "admin app": "::1"}, authenticated=False,
                       allow_open=False, remedy=REMEDY)
    assert "without authentication" in caplog.text and "RUNNING OPEN" not in caplog.text


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.1.2.3", "broker.example.com"])
def test_off_loopback_without_authentication_is_refused(host: str) -> None:
    with pytest.raises(ExposureError, match=REMEDY) as info:
        check_exposure({"client port": "127.0.0.1", "Raft port": host}, authenticated=False,
                       allow_open=False, remedy=REMEDY)
    assert "Raft port" in str(info.value) and "client port" not in str(info.value)


def test_allow_open_runs_with_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_exposure({"client port": "0.0.0.0"}, authenticated=False, allow_open=True,
                       remedy=REMEDY)
    assert "RUNNING OPEN" in caplog.text


def test_authenticated_ports_may_listen_anywhere(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_exposure({"client port": "0.0.0.0"}, authenticated=True, allow_open=False,
                       remedy=REMEDY)
    assert caplog.text == ""
