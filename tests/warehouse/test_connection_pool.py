"""ConnectionPool (warehouse/connection_pool.py) against real warehouses: a PostgreSQL session
is handed from one job to the next only as good as new; anything in doubt is closed."""

from __future__ import annotations

from pathlib import Path

import pytest
from changewatch.warehouse.backends import connect
from changewatch.warehouse.connection_pool import ConnectionPool
from changewatch.warehouse.sync_lock import sync_lock


def backend_pid(wh) -> int:
    return wh.fetch("SELECT pg_backend_pid()")[0][0]


def test_jobs_one_after_another_share_one_session(pg_url: str) -> None:
    with ConnectionPool(pg_url) as pool:
        pids = []
        for _ in range(3):
            with pool.connect() as wh:
                pids.append(backend_pid(wh))  # a read outside transaction(): left open
        assert len(set(pids)) == 1 and pool.opened == 1
        # Given back with no transaction open: another session sees no snapshot held by it.
        with connect(pg_url) as other:
            states = other.fetch("SELECT state FROM pg_stat_activity WHERE pid = $1", (pids[0],))
        assert states == [("idle",)]


def test_a_failed_job_closes_its_connection(pg_url: str) -> None:
    with ConnectionPool(pg_url) as pool:
        with pytest.raises(RuntimeError), pool.connect() as wh:
            first = backend_pid(wh)
            raise RuntimeError("the job failed")
        with pool.connect() as wh:
            assert backend_pid(wh) != first
        assert pool.opened == 2


def test_a_session_holding_a_sync_lock_is_closed_not_handed_on(pg_url: str) -> None:
    with ConnectionPool(pg_url) as pool:
        with pool.connect() as holder:
            holder_pid = backend_pid(holder)
            assert holder.try_hold("changewatch:sync:s")  # taken, never released
        with pool.connect() as wh:
            assert backend_pid(wh) != holder_pid and pool.opened == 2
            with sync_lock(wh, "s"):  # closed, the holder gave the lock back
                pass
        with pool.connect() as wh, sync_lock(wh, "s"):
            # Released in the ordinary way, a session is handed on.
            assert pool.opened == 2


def test_duckdb_connections_are_never_kept(tmp_path: Path) -> None:
    with ConnectionPool(f"duckdb:///{tmp_path / 'w.duckdb'}") as pool:
        for _ in range(2):
            with pool.connect() as wh:
                wh.fetch("SELECT 1")
        assert pool.opened == 2
