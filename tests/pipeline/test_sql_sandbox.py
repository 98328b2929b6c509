"""`changewatch sql` as a sandbox: only reads of the warehouse's tables, bounded in time."""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import duckdb
import pytest
import yaml
from changewatch.pipeline.cli.sql_command import QueryTimeout, run_query
from changewatch.pipeline.project.expected_errors import UsageError
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.schema import ensure_delivery_tables, ensure_evaluation_tables
from changewatch.warehouse.sync import run_sync
from cw_testing import PG_URL, demo_source_settings

CASES = Path(__file__).parent / "sql_sandbox"
COLUMNS = {
    "number": "bigint",
    "title": "text",
    "state": "text",
    "labels": {"type": "text[]", "path": "labels[].name"},
    "assignee": {"type": "text", "path": "assignee.login"},
    "comments": "integer",
    "updated_at": "timestamp",
}
# Runs until something ends it.
FOREVER = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


def backend(url: str) -> str:
    return "duckdb" if url.startswith("duckdb") else "postgres"


def cases(name: str, url: str) -> list:
    loaded = yaml.safe_load((CASES / name).read_text())
    return loaded["both"] + loaded[backend(url)]


@pytest.fixture
def warehouse(warehouse_url: str, demo_api: DemoAPIServer, monkeypatch, tmp_path: Path) -> str:
    """A warehouse holding the demo's issues and their changes, and the watch and delivery
    tables; selected by $CHANGEWATCH_WAREHOUSE_URL, the current folder a fresh one."""
    settings = demo_source_settings(demo_api.url, COLUMNS)
    source = RestSource(RestSourceConfig.model_validate(settings))
    with connect(warehouse_url) as wh:
        run_sync(wh, source)
        with wh.transaction():
            ensure_evaluation_tables(wh)
            ensure_delivery_tables(wh)
    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", warehouse_url)
    monkeypatch.chdir(tmp_path)
    return warehouse_url


@pytest.fixture
def empty_warehouse(warehouse_url: str, monkeypatch) -> str:
    """An existing, empty warehouse (a DuckDB file must exist to be opened read-only)."""
    connect(warehouse_url).close()
    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", warehouse_url)
    return warehouse_url


def query(text: str, fmt: str = "json", **options: float) -> str:
    out = io.StringIO()
    run_query(text, fmt=fmt, out=out, **options)
    return out.getvalue()


def run_cli(*args: str, url: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    return subprocess.run(
        [sys.executable, "-m", "changewatch.pipeline.cli", *args],
        cwd=cwd,
        env=environ | env | {"CHANGEWATCH_WAREHOUSE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,  # a bound for a hung test, far above the seconds these take
    )


def test_reads_of_the_warehouse_run(warehouse: str) -> None:
    failed = {}
    for text in cases("admitted.yaml", warehouse):
        try:
            json.loads(query(text))
        except Exception as error:  # noqa: BLE001 - every failing case is listed at once
            failed[text] = f"{type(error).__name__}: {error}"
    assert not failed, "\n".join(f"{k}\n    {v}" for k, v in failed.items())
    latest = json.loads(query("SELECT number, state, labels FROM issues ORDER BY number LIMIT 5"))
    assert [row["number"] for row in latest] == [1, 2, 3, 4, 5]
    assert all(isinstance(row["labels"], list) for row in latest)
    inserts = query("SELECT count(*) AS n FROM issues_changes WHERE kind = 'insert'")
    assert json.loads(inserts) == [{"n": 40}]


def test_anything_but_a_read_of_the_warehouse_is_refused(warehouse: str, tmp_path: Path) -> None:
    watches = tmp_path / "watches.yaml"
    watches.write_text("sources: []\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    tables = query("SELECT 1 AS one", fmt="csv")
    wrong = {}
    for text, words in cases("refused.yaml", warehouse):
        try:
            query(text)
        except UsageError as error:
            if words not in str(error) or "\n" in str(error):
                wrong[text] = f"said {error}"
        else:
            wrong[text] = "ran"
    assert not wrong, "\n".join(f"{k}\n    {v}" for k, v in wrong.items())
    # Nothing was written, copied, exported or attached, and everything still reads.
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert watches.read_text() == "sources: []\n"
    assert query("SELECT 1 AS one", fmt="csv") == tables
    assert json.loads(query("SELECT count(*) AS n FROM issues")) == [{"n": 40}]


def test_a_refusal_is_one_line_and_shows_no_secret(warehouse: str, tmp_path: Path) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    if backend(warehouse) == "duckdb":
        hostile = "SELECT * FROM read_text('/proc/self/environ')"
        words = "refused: table function read_text is not allowed in changewatch sql"
    else:
        hostile = "SELECT pg_read_file('/proc/self/environ')"
        words = "refused: function pg_read_file is not allowed in changewatch sql"
    done = run_cli("sql", hostile, url=warehouse, cwd=tmp_path, CW_TEST_SECRET=secret)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"changewatch: {words}"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert secret not in done.stdout + done.stderr


def test_the_duckdb_connection_is_a_sandbox_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """Behind the check, the read-only DuckDB connection itself reaches no file or setting."""
    url = f"duckdb:///{tmp_path / 'w.duckdb'}"
    with connect(url) as wh, wh.transaction():
        wh.execute("CREATE TABLE t AS SELECT 1 AS a")
    monkeypatch.setenv("CW_TEST_SECRET", "s3cret-in-the-environment")
    attempts = [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/proc/self/environ')",
        "SELECT * FROM glob('/*')",
        f"COPY t TO '{tmp_path / 'out.csv'}'",
        f"EXPORT DATABASE '{tmp_path / 'exported'}'",
        f"ATTACH '{tmp_path / 'new.duckdb'}' AS other",
        "SET memory_limit = '8GB'",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "INSTALL httpfs",
        "LOAD httpfs",
    ]
    with connect(url, read_only=True) as wh:
        for text in attempts:
            with pytest.raises(duckdb.Error):
                wh.fetch(text)
        assert wh.fetch("SELECT a FROM t") == [(1,)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.duckdb"]


def test_a_never_ending_query_ends_at_its_timeout(empty_warehouse: str, tmp_path: Path) -> None:
    warehouse_url = empty_warehouse
    started = time.monotonic()
    done = run_cli("sql", FOREVER, "--timeout", "1", url=warehouse_url, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        "changewatch: the query ran past its 1 s limit (--timeout SECONDS to change it)\n"
    )
    assert time.monotonic() - started >= 1
    # A query that ends in time is unaffected by the limit.
    fine = run_cli("sql", "SELECT 42 AS answer", "--timeout", "1", url=warehouse_url, cwd=tmp_path)
    assert fine.returncode == 0 and "42" in fine.stdout, fine.stderr
    # No limit is no option: 0 (or beyond PostgreSQL's 24 days) is a usage error.
    none = run_cli("sql", "SELECT 1", "--timeout", "0", url=warehouse_url, cwd=tmp_path)
    assert none.returncode == 2
    assert none.stderr.endswith(
        "error: argument --timeout: expected a number of seconds above 0 and up to 2073600, "
        "not '0'\n"
    ), none.stderr


def test_the_timeout_ends_a_query_in_process_too(empty_warehouse: str) -> None:
    # Each call builds up to sql_bounds.MAX_BUILT characters: the watchdog must land between.
    huge = "SELECT max(length(repeat('x', 900000 + CAST(n % 1000 AS INTEGER)))) FROM r"
    text = FOREVER.replace("SELECT count(*) FROM r", huge)
    with pytest.raises(QueryTimeout, match=r"^the query ran past its 0\.5 s limit"):
        query(text, timeout=0.5)


def test_a_killed_clients_query_ends_on_the_server(tmp_path: Path) -> None:
    """PostgreSQL does not notice a dead client while a query runs: the statement timeout,
    a server setting of the session, ends it."""
    marker = f"cw-{uuid.uuid4().hex}"
    text = FOREVER.replace("count(*)", f"count(*), '{marker}' AS marker")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    client = subprocess.Popen(
        [sys.executable, "-m", "changewatch.pipeline.cli", "sql", text, "--timeout", "3"],
        cwd=tmp_path,
        env=environ | {"CHANGEWATCH_WAREHOUSE_URL": PG_URL},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    running = "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1"
    with adbc.connect(PG_URL) as con, con.cursor() as cur:
        try:
            pids = wait_for(cur, running, f"%{marker}%", present=True, client=client)
            client.send_signal(signal.SIGKILL)
            client.wait(timeout=60)
            ended = time.monotonic()
            # Ends within its 3 s of running; without the limit it would run for ever.
            assert wait_for(cur, running, f"%{marker}%", present=False) == []
            assert time.monotonic() - ended < 3 + 30
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE $1 "
                "AND pid <> pg_backend_pid()",
                (f"%{marker}%",),
            )
            cur.fetchall()
    assert pids


def wait_for(cur, sql: str, pattern: str, *, present: bool, client=None) -> list[int]:
    """Poll until the query's rows are there (``present``) or gone; give up after a minute,
    far beyond the seconds it takes."""
    deadline = time.monotonic() + 60
    while True:
        cur.execute(sql, (pattern,))
        pids = [row[0] for row in cur.fetchall() if row[0] is not None]
        cur.connection.rollback()  # pg_stat_activity is read once per transaction
        if bool(pids) == present or time.monotonic() > deadline:
            return pids
        if client is not None and client.poll() is not None:
            return pids  # it ended before it was seen: the assertion below says so
        time.sleep(0.05)


def test_json_csv_and_table_print_void_and_binary_columns(empty_warehouse: str) -> None:
    if backend(empty_warehouse) == "duckdb":
        text = "SELECT NULL AS v, CAST('ab' AS BLOB) AS b, ['ab'::BLOB] AS l"
    else:
        text = "SELECT NULL::void AS v, CAST('ab' AS bytea) AS b, ARRAY['ab'::bytea] AS l"
    assert json.loads(query(text)) == [{"v": None, "b": "6162", "l": ["6162"]}]
    assert query(text, fmt="csv") == 'v,b,l\n,6162,"[""6162""]"\n'
    assert "6162" in query(text, fmt="table")


def on_a_terminal(*args: str, url: str, cwd: Path) -> str:
    """What the CLI prints with its standard output on a pseudo-terminal."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    screen, terminal = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "changewatch.pipeline.cli", *args],
            cwd=cwd,
            env=environ | {"CHANGEWATCH_WAREHOUSE_URL": url},
            stdout=terminal,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,  # a bound for a hung test, far above the seconds these take
        )
        os.close(terminal)
        terminal = -1
        assert done.returncode == 0, done.stderr
        shown = b""
        while True:
            try:
                chunk = os.read(screen, 65536)
            except OSError:  # EIO: the terminal's other end is closed and all was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(screen)
        if terminal != -1:
            os.close(terminal)
    return shown.decode().replace("\r\n", "\n")


def test_a_terminal_shows_column_names_and_values_only(warehouse: str, tmp_path: Path) -> None:
    text = "SELECT number, state, comments FROM issues ORDER BY number LIMIT 4"
    shown = on_a_terminal("sql", text, url=warehouse, cwd=tmp_path)
    lines = shown.splitlines()
    assert "shape:" not in shown and "i64" not in shown and "str" not in shown, shown
    assert len(lines) == 4 + 4  # the frame, the names, the rule, four rows, the frame
    assert [name.strip(" │") for name in lines[1].split("┆")] == ["number", "state", "comments"]
    expected = json.loads(query(text))
    for line, row in zip(lines[3:7], expected, strict=True):
        assert [cell.strip(" │") for cell in line.split("┆")] == [str(v) for v in row.values()]
    # A result cut to fit the terminal says how much there was.
    text = "SELECT a.number FROM issues a CROSS JOIN issues b"
    cut = on_a_terminal("sql", text, url=warehouse, cwd=tmp_path)
    assert cut.endswith("\n(cut to fit: 1600 row(s), 1 column(s); --format csv prints all)\n")
