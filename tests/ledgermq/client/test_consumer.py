"""Consumers refuse names no broker accepts when they are made, instead of
retrying refused requests forever (`ledgermq consume --group "bad name!"`
used to wait in silence)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ledgermq.cli import app
from ledgermq.client import PullConsumer, PushConsumer

NOWHERE = ["127.0.0.1:9"]  # never dialled: the names are refused first
BAD_GROUPS = ["", "bad name!", "g\n", "g" * 256, "a/b", "é"]
BAD_TOPICS = ["", "t\n", "a b", "x" * 128, "../t"]


@pytest.mark.parametrize("group", BAD_GROUPS)
def test_a_bad_group_name_is_refused_by_both_consumers(group: str) -> None:
    with pytest.raises(ValueError, match="invalid consumer group name"):
        PullConsumer(NOWHERE, group)
    with pytest.raises(ValueError, match="invalid consumer group name"):
        PushConsumer(NOWHERE, group, "t", lambda message: None)


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_a_bad_topic_name_is_refused_by_the_push_consumer(topic: str) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        PushConsumer(NOWHERE, "g", topic, lambda message: None)


def test_good_names_make_consumers() -> None:
    PullConsumer(NOWHERE, "%RETRY%g_1|x")
    PushConsumer(NOWHERE, "g" * 255, "t" * 127, lambda message: None)


def test_the_consume_command_says_what_is_wrong_with_the_group_and_exits() -> None:
    result = CliRunner().invoke(app, ["consume", "t", "--group", "bad name!", "--count", "1",
                                      "--namesrv", NOWHERE[0]])
    assert result.exit_code != 0
    assert "invalid consumer group name 'bad name!'" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
