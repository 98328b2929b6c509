"""Dagster's storage on PostgreSQL as deploy/ sets it (pipeline/definitions/postgres_storage.py)
waits for a database that is down longer than dagster-postgres's own retries last: a restart
of the db host must not lose an event written meanwhile (a step's failure, a run's end)."""

from __future__ import annotations

import shutil
import sys
import threading
import time

import dagster as dg
import pytest
from cw_testing import REPO

sys.path.insert(0, str(REPO / "bench"))  # a server of the test's own, to stop and start

from private_postgres import private_postgres  # noqa: E402

pytestmark = pytest.mark.e2e

# dagster-postgres alone gives up after about 11 s (5 retries); this storage after about 49.
DOWN_S = 15


def test_a_query_waits_for_a_database_down_longer_than_dagster_postgres_retries(
    tmp_path, monkeypatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with private_postgres() as server:
        url = server.url.replace("postgresql://", "postgresql+psycopg2://", 1)
        monkeypatch.setenv("DAGSTER_PG_URL", url)
        with dg.DagsterInstance.get() as instance:
            assert instance.get_runs() == []  # its kept connection, now open
            server.stop()
            back = threading.Timer(DOWN_S, server.start)
            back.start()
            began = time.monotonic()
            try:
                # The kept connection is dead (the ping finds it) and the server refuses new
                # ones for DOWN_S: the query waits, then succeeds on a new connection.
                assert instance.get_runs() == []
                assert instance.event_log_storage.get_concurrency_keys() == set()
            finally:
                back.join()
            assert time.monotonic() - began >= DOWN_S - 1
