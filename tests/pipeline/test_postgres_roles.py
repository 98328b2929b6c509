"""deploy/postgres-roles.sql: a sync works as its owner role, `changewatch sql` as its reader,
and neither reaches what a superuser could (server files, programs, pg_authid)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import adbc_driver_postgresql.dbapi as adbc
import pytest
from changewatch.pipeline.cli.sql_command import run_query
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from cw_testing import PG_URL, REPO, demo_source_settings

COLUMNS = {"number": "bigint", "title": "text", "updated_at": "timestamp"}


@pytest.fixture
def roles() -> Iterator[dict[str, str]]:
    """The script run as the test server's superuser, under names of this test's own."""
    tag = uuid.uuid4().hex[:8]
    names = {
        "owner": f"cw_owner_{tag}",
        "reader": f"cw_reader_{tag}",
        "warehouse_db": f"cw_wh_{tag}",
        "dagster_db": f"cw_dg_{tag}",
        "owner_password": "owner-pw",
        "reader_password": "reader-pw",
    }
    psql = shutil.which("psql")
    assert psql, "psql (PostgreSQL's client) runs deploy/postgres-roles.sql"
    variables = [arg for key, value in names.items() for arg in ("-v", f"{key}={value}")]
    command = [psql, PG_URL, "-X", "-q", *variables, "-f", str(REPO / "deploy/postgres-roles.sql")]
    try:
        for _ in range(2):  # running it again changes nothing
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        yield names
    finally:
        with adbc.connect(PG_URL, autocommit=True) as con, con.cursor() as cur:
            for database in (names["warehouse_db"], names["dagster_db"]):
                cur.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            for role in (names["owner"], names["reader"]):
                cur.execute(f'DROP ROLE IF EXISTS "{role}"')


def url_as(role: str, password: str, database: str, *, schema: str | None = "warehouse") -> str:
    parts = urlsplit(PG_URL)
    where = f"{parts.hostname}:{parts.port or 5432}"
    query = f"?schema={schema}" if schema else ""
    return f"postgresql://{role}:{password}@{where}/{database}{query}"


def refused(url: str, sql: str) -> str:
    """The server's error for ``sql`` (statements separated by "; ") run as the URL's role;
    fails the test if it all runs."""
    try:
        with adbc.connect(url) as con, con.cursor() as cur:
            for statement in sql.split("; "):
                cur.execute(statement)
            cur.fetchall()
    except adbc.Error as error:
        return str(error)
    raise AssertionError(f"{sql} ran as {urlsplit(url).username}")


def test_the_deployment_roles(roles: dict[str, str], demo_api: DemoAPIServer, monkeypatch) -> None:
    owner = url_as(roles["owner"], roles["owner_password"], roles["warehouse_db"])
    reader = url_as(roles["reader"], roles["reader_password"], roles["warehouse_db"])
    settings = demo_source_settings(demo_api.url, COLUMNS)
    with connect(owner) as wh:  # a whole first sync: schema, tables, staging, bulk load
        stats = run_sync(wh, RestSource(RestSourceConfig.model_validate(settings)))
    assert stats.inserted == 40

    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", reader)
    out = io.StringIO()
    run_query("SELECT count(*) AS n FROM issues", fmt="json", out=out)
    assert json.loads(out.getvalue()) == [{"n": 40}]

    # What the issue ran as the superuser, refused by the server itself (not by our check).
    owner = url_as(roles["owner"], roles["owner_password"], roles["warehouse_db"], schema=None)
    reader = url_as(roles["reader"], roles["reader_password"], roles["warehouse_db"], schema=None)
    for url in (owner, reader):
        assert "permission denied" in refused(url, "SELECT pg_read_file('/etc/passwd')")
        assert "permission denied" in refused(url, "SELECT * FROM pg_catalog.pg_authid")
        assert "pg_execute_server_program" in refused(url, "COPY (SELECT 1) TO PROGRAM 'id'")
        assert "pg_write_server_files" in refused(url, "COPY (SELECT 1) TO '/tmp/cw-copy'")
        assert "CHECKPOINT" in refused(url, "CHECKPOINT")
    assert "read-only transaction" in refused(reader, "CREATE TABLE x (a int)")
    assert "read-only transaction" in refused(reader, "DELETE FROM warehouse.issues")
    # Read-write on request, the reader still has no right to write.
    writing = "SET default_transaction_read_only = off; COMMIT; DELETE FROM warehouse.issues"
    assert "permission denied for table issues" in refused(reader, writing)
    with adbc.connect(reader) as con, con.cursor() as cur:
        cur.execute(
            "SELECT current_setting('statement_timeout'), current_setting('temp_file_limit')"
        )
        assert cur.fetchall() == [("1min", "1GB")]
    dagster = url_as(roles["owner"], roles["owner_password"], roles["dagster_db"], schema=None)
    with adbc.connect(dagster) as con, con.cursor() as cur:  # Dagster creates its tables
        cur.execute("CREATE TABLE runs (id int)")
        con.commit()
    assert "User does not have CONNECT privilege" in refused(
        url_as(roles["reader"], roles["reader_password"], roles["dagster_db"], schema=None),
        "SELECT 1",
    )
