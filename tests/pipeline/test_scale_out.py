"""Eight sources synced at once by eight processes, one PostgreSQL warehouse, one Dagster instance.

Each `changewatch sync <source>` is its own process (as a run launched by the daemon would be),
recording into the deployment's instance (deploy/dagster.yaml, Dagster storage in a database of
its own). A gate proves the syncs overlap: the test holds every source's sync lock, so each
sync fetches and then waits at its commit; only when all eight wait at once is the gate opened.
With one `warehouse` pool slot for everything, seven would wait for the slot instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import psycopg2
import pytest
import yaml
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import connect
from cw_testing import PG_URL, REPO

SOURCES = [f"tracker_{i}" for i in range(8)]
BIN = Path(sys.executable).parent
CHANGEWATCH = BIN / "changewatch"
# Eight processes importing Dagster on a busy two-core machine take a while to get there.
GATE_TIMEOUT_S = 120


@pytest.fixture
def pg_warehouse() -> Iterator[str]:
    schema = f"cw_test_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    with adbc.connect(PG_URL) as con, con.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        con.commit()


@pytest.fixture
def trackers() -> Iterator[dict[str, DemoAPIServer]]:
    """Eight demo trackers, each its own API server on loopback, with different issues."""
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(DemoAPIServer(DemoTracker(issues=30, seed=i)))
            for i, name in enumerate(SOURCES)
        }


def deploy_services() -> dict:
    return yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())["services"]


def write_watches(path: Path, trackers: dict[str, DemoAPIServer]) -> Path:
    sources = [
        {
            "name": name,
            "type": "rest",
            "base_url": server.url,
            "path": "/repos/acme/widgets/issues",
            "params": {"state": "all", "per_page": 100},
            "paginator": {"type": "link_header"},
            "sync": "snapshot",
            "baseline": "evaluate",
            "table": name,
            "primary_key": "number",
            "updated_at": "updated_at",
            "columns": {
                "number": "bigint",
                "title": "text",
                "state": "text",
                "labels": {"type": "text[]", "path": "labels[].name"},
                "updated_at": "timestamp",
            },
        }
        for name, server in trackers.items()
    ]
    watches = [
        {
            "name": f"every_change_{name}",
            "source": name,
            "where": "kind = 'insert' OR kind = 'update' OR kind = 'delete'",
            "channels": ["file"],
            "dedupe": "per_transition",
            "title": "Change #{{ key }}",
        }
        for name in trackers
    ]
    config = {
        "version": 1,
        "sources": sources,
        "channels": [{"name": "file", "type": "file", "path": "notifications.jsonl"}],
        "watches": watches,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def sync_lock_keys() -> list[str]:
    return [f"changewatch:sync:{name}" for name in SOURCES]


def waiting_at_gate(con) -> int:
    """Syncs waiting for a sync lock the test holds: each is a step inside its pool slot."""
    with con.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FROM pg_locks l
            JOIN (SELECT hashtextextended(k, 0) AS h FROM unnest(%s::text[]) AS k) keys
              ON l.classid::bigint = (keys.h >> 32) & 4294967295
             AND l.objid::bigint = keys.h & 4294967295
            WHERE l.locktype = 'advisory' AND NOT l.granted
            """,
            (sync_lock_keys(),),
        )
        return cur.fetchone()[0]


def sync_all_at_once(env: dict[str, str], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Start `changewatch sync <source>` for every source at once, behind the gate."""
    gate = psycopg2.connect(PG_URL)
    gate.autocommit = True
    procs = []
    try:
        with gate.cursor() as cur:
            for key in sync_lock_keys():
                cur.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        procs = [
            subprocess.Popen(
                [str(CHANGEWATCH), "sync", name],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in SOURCES
        ]
        deadline = time.monotonic() + GATE_TIMEOUT_S
        waiting = 0
        while time.monotonic() < deadline and waiting < len(SOURCES):
            if any(p.poll() is not None for p in procs):
                break  # a sync ended before the gate opened: it failed
            time.sleep(0.2)
            waiting = waiting_at_gate(gate)
        ended = [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        assert waiting == len(SOURCES), (
            f"only {waiting} of {len(SOURCES)} syncs were writing at the same time; "
            f"ended early: {ended}"
        )
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        with gate.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock_all()")
        gate.close()
    results = []
    for name, p in zip(SOURCES, procs, strict=True):
        out, err = p.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        assert p.returncode == 0, f"{name}: exit {p.returncode}\n{out}\n{err}"
    return results


def check_warehouse(url: str, lines_path: Path, expected: dict[str, dict[str, set[int]]]) -> int:
    """Every expected change recorded once, notified once, delivered to the file once."""
    notified = 0
    with connect(url) as wh:
        for name in SOURCES:
            rows = wh.fetch(f'SELECT kind, object_key FROM "{name}_changes"')
            by_kind: dict[str, list[int]] = {}
            for kind, key in rows:
                by_kind.setdefault(kind, []).append(int(key))
            # Once each: no change recorded twice, none missing.
            assert {k: sorted(v) for k, v in by_kind.items()} == {
                k: sorted(v) for k, v in expected[name].items() if v
            }, name
            notified += len(rows)
        [(runs, failed)] = wh.fetch(
            "SELECT count(*), count(*) FILTER (WHERE status <> 'succeeded') FROM sync_runs"
        )
        assert failed == 0
        [(outbox, keys)] = wh.fetch("SELECT count(*), count(DISTINCT dedupe_key) FROM outbox")
        assert outbox == keys == notified  # one notification per change, each key once
        ids = {row[0] for row in wh.fetch("SELECT notification_id FROM outbox")}
        statuses = wh.fetch("SELECT status, count(*) FROM deliveries GROUP BY status")
        assert statuses == [("sent", outbox)]
    lines = [json.loads(line) for line in lines_path.read_text(encoding="utf-8").splitlines()]
    sent = [line["notification_id"] for line in lines]
    assert len(sent) == len(set(sent)) == outbox  # no notification written twice
    assert set(sent) == ids
    return runs


def test_eight_sources_sync_at_once_on_postgres_with_no_conflict_or_duplicate(
    tmp_path, trackers, pg_warehouse, dagster_db
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    config = write_watches(tmp_path / "watches.yaml", trackers)
    env = os.environ | {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": dagster_db,
        "CHANGEWATCH_CONFIG": str(config),
        "CHANGEWATCH_WAREHOUSE_URL": pg_warehouse,
    }
    # The deployment's one-off step (the compose file's `init`): every sync job ends in the
    # delivery pool, and Dagster's first use of a pool inserts its limit, which two processes
    # doing it at once on PostgreSQL fail at ("current transaction is aborted").
    init = deploy_services()["init"]["command"]
    subprocess.run([str(BIN / init[0]), *init[1:]], env=env, check=True, capture_output=True)

    sync_all_at_once(env, tmp_path)
    expected = {
        name: {"insert": {issue["number"] for issue in server.tracker.snapshot()}}
        for name, server in trackers.items()
    }
    assert check_warehouse(pg_warehouse, tmp_path / "notifications.jsonl", expected) == 8

    # Every tracker changes, then all sync at once again: only the new changes, once each.
    for name, server in trackers.items():
        done = server.tracker.mutate(create=2, update=3, delete=1)
        expected[name]["insert"] |= set(done["created"])
        expected[name]["update"] = set(done["updated"])
        expected[name]["delete"] = set(done["deleted"])
    sync_all_at_once(env, tmp_path)
    assert check_warehouse(pg_warehouse, tmp_path / "notifications.jsonl", expected) == 16

    # The runs are in the shared Dagster instance, one per process and round.
    plain = dagster_db.replace("postgresql+psycopg2://", "postgresql://")
    with closing(psycopg2.connect(plain)) as con, con.cursor() as cur:
        cur.execute("SELECT status, count(*) FROM runs GROUP BY status")
        assert cur.fetchall() == [("SUCCESS", 16)]
