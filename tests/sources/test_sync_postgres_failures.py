"""Syncs on PostgreSQL meeting each other or losing their connection: the loser of a race
skips (exit 0), a dropped connection is named as such, and neither stores anything half-done."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.rest import build_rest_source
from changewatch.warehouse import connect
from changewatch.warehouse.backends import ConnectionLost
from changewatch.warehouse.sync import run_sync
from cw_testing import PG_URL

RECORDS = [{"id": i, "title": f"item {i}"} for i in range(5)]
# Bounds a broken test waits for, never a guess at how long the work takes: each is hit
# only when something hangs.
HANG = 300


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def source_settings(api: ApiServer) -> dict:
    return {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint", "title": "text"},
        "base_url": api.base_url,
        "path": "items",
    }


def stored(url: str) -> tuple[list, list]:
    """The source's rows and its sync_state, on a connection of the test's own."""
    with connect(url) as wh:
        tables = {row[0] for row in wh.fetch("SELECT table_name FROM information_schema.tables")}
        rows = wh.fetch("SELECT id FROM items ORDER BY id") if "items" in tables else []
        state = wh.fetch("SELECT source FROM sync_state") if "sync_state" in tables else []
    return rows, state


def test_a_dropped_connection_is_named_and_nothing_is_stored(pg_url: str, api: ApiServer) -> None:
    with connect(pg_url) as wh:
        with wh.transaction():
            [(pid,)] = wh.fetch("SELECT pg_backend_pid()")
        ended = threading.Event()

        def end_the_sync_connection(request: Received) -> Reply:
            # While the sync walks: its connection to the warehouse is ended by the server.
            with adbc.connect(PG_URL) as con, con.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(CAST($1 AS integer))", (pid,))
                assert cur.fetchall() == [(True,)]
            ended.set()
            return Reply.json(RECORDS)

        api.route("/items", end_the_sync_connection)
        with pytest.raises(ConnectionLost) as lost:
            run_sync(wh, build_rest_source(source_settings(api)))
    assert ended.is_set()
    message = str(lost.value)
    assert message.startswith("source 'acme_items': the connection to PostgreSQL at ")
    assert "was lost (terminating connection due to administrator command)" in message
    assert "nothing of it is stored" in message
    assert "rollback" not in message
    assert stored(pg_url) == ([], [])
    # The next sync, on a connection that stays, stores everything.
    api.route("/items", lambda request: Reply.json(RECORDS))
    with connect(pg_url) as wh:
        assert run_sync(wh, build_rest_source(source_settings(api))).inserted == 5
        statuses = wh.fetch("SELECT status FROM sync_runs ORDER BY started_at")
    # The lost sync could not mark itself failed: the next one marked it abandoned.
    assert statuses == [("abandoned",), ("succeeded",)]
    assert stored(pg_url) == ([(i,) for i in range(5)], [("acme_items",)])


@pytest.mark.e2e  # two `changewatch sync` processes at once
def test_the_loser_of_two_racing_syncs_skips_with_exit_0(
    pg_url: str, api: ApiServer, tmp_path: Path
) -> None:
    first_fetching, release = threading.Event(), threading.Event()

    def hold_the_first_sync(request: Received) -> Reply:
        # Every request waits until the second sync has come and gone: the first sync's, which
        # holds the source's lock meanwhile, and its retries when its read times out (30 s)
        # before the second process has started on a loaded machine. Were the loser to walk,
        # its request would wait too and the test would fail on its timeout.
        first_fetching.set()
        release.wait(HANG)
        return Reply.json(RECORDS)

    api.route("/items", hold_the_first_sync)
    config = tmp_path / "watches.yaml"
    config.write_text(
        "version: 1\nsources:\n"
        f"  - name: acme_items\n    type: rest\n    base_url: {api.base_url}\n"
        "    path: items\n    table: items\n    primary_key: id\n"
        "    columns:\n      id: bigint\n      title: text\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    env |= {"CHANGEWATCH_CONFIG": str(config), "CHANGEWATCH_WAREHOUSE_URL": pg_url}

    def sync() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "changewatch.pipeline.cli", "sync", "acme_items"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    processes = [sync()]  # the winner
    try:
        assert first_fetching.wait(HANG), processes[0].communicate(timeout=HANG)
        processes.append(sync())  # the loser
        out, err = processes[1].communicate(timeout=HANG)
        assert (processes[1].returncode, err) == (0, ""), err
        assert "items: skipped: another sync of acme_items is running" in out.splitlines()
        release.set()
        out, err = processes[0].communicate(timeout=HANG)
        assert processes[0].returncode == 0, err
        assert "5 inserted" in out
    finally:
        release.set()
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    with connect(pg_url) as wh:
        # The loser recorded no attempt (nor marked the winner's abandoned).
        assert wh.fetch("SELECT status FROM sync_runs") == [("succeeded",)]
