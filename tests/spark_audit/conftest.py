"""One SparkSession for the whole test run (JVM start costs ~10 s), and shared data."""

from __future__ import annotations

import pytest
from support import have_java, require


@pytest.fixture(scope="session")
def spark():
    require(have_java(), "Java is needed for PySpark")
    from spark_audit.session import get_session

    session = get_session("local[2]", app_name="ledgermq-audit-tests", progress=False,
                          shuffle_partitions=2)
    yield session
    session.stop()
