"""The sync lock is the source's within one warehouse: warehouses sharing a database do not meet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import adbc_driver_postgresql.dbapi as adbc
import pytest
from changewatch.warehouse import connect
from changewatch.warehouse.sync_lock import SyncSkipped, sync_lock
from cw_testing import PG_URL


@pytest.fixture
def two_schemas() -> Iterator[tuple[str, str]]:
    names = tuple(f"cw_test_{uuid.uuid4().hex[:12]}" for _ in range(2))
    yield names
    with adbc.connect(PG_URL) as con, con.cursor() as cur:
        for name in names:
            cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        con.commit()


def test_one_source_syncs_at_once_per_warehouse_not_per_database(
    two_schemas: tuple[str, str],
) -> None:
    first, second = two_schemas
    with (
        connect(f"{PG_URL}?schema={first}") as a,
        connect(f"{PG_URL}?schema={first}") as a_again,
        connect(f"{PG_URL}?schema={second}") as b,
    ):
        with sync_lock(a, "demo_issues"):
            # The same source in another warehouse of the same database syncs at once...
            with sync_lock(b, "demo_issues"):
                pass
            # ...while a second sync of it in the same warehouse is skipped.
            with pytest.raises(SyncSkipped, match="another sync of demo_issues is running"):
                with sync_lock(a_again, "demo_issues"):
                    pass
        with sync_lock(a_again, "demo_issues"):
            pass
