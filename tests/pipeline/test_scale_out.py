"""The multi-process deployment: deploy/ and eight sources syncing at once on PostgreSQL.

Each `changewatch sync <source>` is its own process (as a run launched by the daemon would be),
recording into the deployment's instance (deploy/dagster.yaml, Dagster storage in a database of
its own). A gate proves the syncs overlap: the test holds every source's `sync_state` row, so
each sync fetches and then waits at its commit; only when all eight wait at once is the gate
opened. With one `warehouse` pool slot for everything, seven would wait for the slot instead.

No Docker engine runs here: the compose file is checked as data against the commands the
docs/deploy.md documents, and those commands run for real (code server, webserver, daemon).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dagster as dg
import httpx
import psycopg2
import pytest
import yaml
from changewatch.pipeline.assets.batched_syncs import BATCH_JOB
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import connect
from changewatch.warehouse.schema import ensure_bookkeeping
from cw_testing import PG_URL, REPO
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from patience import STALL_S, reaped, wait_working

# Minutes of subprocesses: started first (see tests/conftest.py).
pytestmark = [pytest.mark.heavy, pytest.mark.e2e]  # e2e: run by `pytest -m e2e`

SOURCES = [f"tracker_{i}" for i in range(8)]
BIN = Path(sys.executable).parent
CHANGEWATCH = BIN / "changewatch"
# The sync sensor's minimum interval (pipeline/triggers/sync_sensors.py): the daemon's first tick
# may wait it.
SENSOR_INTERVAL_S = 30


def serve(stack: ExitStack, names: list[str]) -> dict[str, DemoAPIServer]:
    """A demo tracker per name, each its own API server on loopback, with different issues."""
    return {
        name: stack.enter_context(DemoAPIServer(DemoTracker(issues=30, seed=i)))
        for i, name in enumerate(names)
    }


@pytest.fixture
def trackers() -> Iterator[dict[str, DemoAPIServer]]:
    with ExitStack() as stack:
        yield serve(stack, SOURCES)


@pytest.fixture
def two_trackers() -> Iterator[dict[str, DemoAPIServer]]:
    with ExitStack() as stack:
        yield serve(stack, SOURCES[:2])


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


@contextmanager
def gate(warehouse_url: str, sources: list[str]) -> Iterator[Callable[[], int]]:
    """Hold every source's `sync_state` row in an open transaction; yields how many syncs
    wait on it right now.

    A sync writes its `sync_state` row last in its commit transaction: a sync waiting here has
    fetched and written its changes, uncommitted, inside its step and so inside its pool
    slot. (Its sync lock is no gate: a sync that finds it held skips.) Leaving the block rolls
    the transaction back, writing nothing, and opens the gate.
    """
    with connect(warehouse_url) as wh, wh.transaction():
        ensure_bookkeeping(wh)  # the first sync's table, so its rows can be held before it
    schema = parse_qs(urlsplit(warehouse_url).query)["schema"][0]
    holder = psycopg2.connect(PG_URL)  # a transaction, held until the gate opens
    watcher = psycopg2.connect(PG_URL)
    watcher.autocommit = True

    def waiting() -> int:
        with watcher.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (holder.get_backend_pid(),),
            )
            return cur.fetchone()[0]

    try:
        with holder.cursor() as cur:
            for name in sources:
                cur.execute(
                    f'INSERT INTO "{schema}".sync_state (source, table_name) VALUES (%s, %s) '
                    "ON CONFLICT (source) DO UPDATE SET table_name = EXCLUDED.table_name",
                    (name, name),
                )
        yield waiting
    finally:
        holder.rollback()
        holder.close()
        watcher.close()


def sync_all_at_once(env: dict[str, str], cwd: Path) -> None:
    """Start `changewatch sync <source>` for every source at once, behind the gate.

    The waits follow the work (see tests/patience.py): the first sync to reach the gate shows
    how long getting there takes on this machine right now, and the others, started at the
    same moment, get twice that (plus a stall's worth) to join it.
    """
    with ExitStack() as stack:
        # Files, not pipes: nothing blocks on a full pipe, and nothing is left open.
        outputs = {name: stack.enter_context(tempfile.TemporaryFile("w+")) for name in SOURCES}
        procs = stack.enter_context(reaped([]))  # killed and reaped first, whatever happens

        def output(name: str) -> str:
            outputs[name].seek(0)
            return outputs[name].read()[-2000:]

        def ended() -> list[str]:
            return [n for n, p in zip(SOURCES, procs, strict=True) if p.poll() is not None]

        with gate(env["CHANGEWATCH_WAREHOUSE_URL"], SOURCES) as waiting:
            for name in SOURCES:
                command = [str(CHANGEWATCH), "sync", name]
                out = outputs[name]
                procs.append(
                    subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=out, text=True)
                )

            def pids() -> list[int]:
                return [p.pid for p in procs]

            early = "a sync ended before the gate opened, so it failed"
            first = wait_working(
                lambda: waiting() >= 1 or bool(ended()), pids=pids, what="the first sync"
            )
            assert not ended(), f"{early}: {[output(n) for n in ended()]}"
            wait_working(
                lambda: waiting() == len(SOURCES) or bool(ended()),
                pids=pids,
                progress=waiting,
                limit=2 * first + STALL_S,
                what=f"{len(SOURCES)} syncs writing at the same time (progress: how many were)",
            )
            assert not ended(), f"{early}: {[output(n) for n in ended()]}"
            assert waiting() == len(SOURCES)
        # The gate is open: each commits, evaluates and delivers, less than it did to get here.
        wait_working(
            lambda: len(ended()) == len(SOURCES),
            pids=pids,
            progress=lambda: len(ended()),
            limit=2 * first + STALL_S,
            what="the syncs, once the gate opened",
        )
        for name, p in zip(SOURCES, procs, strict=True):
            assert p.returncode == 0, f"{name}: exit {p.returncode}\n{output(name)}"


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
    tmp_path, trackers, pg_url, dagster_db
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    config = write_watches(tmp_path / "watches.yaml", trackers)
    env = os.environ | {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": dagster_db,
        "CHANGEWATCH_CONFIG": str(config),
        "CHANGEWATCH_WAREHOUSE_URL": pg_url,
    }
    # The deployment's one-off step (the compose file's `init`): every sync job ends in the
    # delivery pool, and Dagster's first use of a pool inserts its limit, which two processes
    # doing it at once on PostgreSQL fail at ("current transaction is aborted").
    init = compose()["services"]["init"]["command"]
    subprocess.run([str(BIN / init[0]), *init[1:]], env=env, check=True, capture_output=True)

    sync_all_at_once(env, tmp_path)
    expected = {
        name: {"insert": {issue["number"] for issue in server.tracker.snapshot()}}
        for name, server in trackers.items()
    }
    assert check_warehouse(pg_url, tmp_path / "notifications.jsonl", expected) == 8

    # Every tracker changes, then all sync at once again: only the new changes, once each.
    for name, server in trackers.items():
        done = server.tracker.mutate(create=2, update=3, delete=1)
        expected[name]["insert"] |= set(done["created"])
        expected[name]["update"] = set(done["updated"])
        expected[name]["delete"] = set(done["deleted"])
    sync_all_at_once(env, tmp_path)
    assert check_warehouse(pg_url, tmp_path / "notifications.jsonl", expected) == 16

    # The runs are in the shared Dagster instance, one per process and round.
    plain = dagster_db.replace("postgresql+psycopg2://", "postgresql://")
    with closing(psycopg2.connect(plain)) as con, con.cursor() as cur:
        cur.execute("SELECT status, count(*) FROM runs GROUP BY status")
        assert cur.fetchall() == [("SUCCESS", 16)]


DEPLOY = REPO / "deploy"


def documented_commands() -> list[list[str]]:
    """The commands of the docs' "Deploy on several processes" block, minus setup."""
    page = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = page.split("# Deploy on several processes", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [
        shlex.split(line)
        for line in block.splitlines()
        if line.strip() and not line.startswith(("export ", "cd "))
    ]


def documented_environment() -> dict[str, str]:
    """The variables the docs' "Deploy on several processes" block exports."""
    page = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = page.split("# Deploy on several processes", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    words = [
        w
        for line in block.splitlines()
        if line.startswith("export ")
        for w in shlex.split(line, comments=True)[1:]
    ]
    return dict(word.split("=", 1) for word in words)


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))


def test_compose_runs_the_documented_processes_on_one_postgres():
    services = compose()["services"]
    assert set(services) == {"postgres", "init", "code", "webserver", "daemon", "webhooks"}
    # Each changewatch service runs one documented command, in the documented order.
    assert [services[name]["command"] for name in ("init", "code", "webserver", "daemon")] == (
        documented_commands()
    )
    assert services["init"]["command"][:4] == ["dagster", "instance", "concurrency", "set"]
    assert services["code"]["command"][:3] == ["dagster", "code-server", "start"]
    assert services["webserver"]["command"][0] == "dagster-webserver"
    # The daemon with two malloc arenas (its re-reads of the code location fragment more).
    assert services["daemon"]["command"][:4] == [
        "env",
        "MALLOC_ARENA_MAX=2",
        "dagster-daemon",
        "run",
    ]

    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:")
    # The superuser runs only the role script, once, on an empty data volume; everything else
    # connects as the least-privilege roles it creates, under the names it creates them.
    assert postgres["environment"]["POSTGRES_USER"] == "postgres"
    assert (
        "./postgres-init.sh:/docker-entrypoint-initdb.d/postgres-init.sh:ro"
        in (postgres["volumes"])
    )
    assert "./postgres-roles.sql:/opt/changewatch/postgres-roles.sql:ro" in postgres["volumes"]
    init_script = (DEPLOY / "postgres-init.sh").read_text(encoding="utf-8")
    assert "-f /opt/changewatch/postgres-roles.sql" in init_script
    roles_sql = (DEPLOY / "postgres-roles.sql").read_text(encoding="utf-8")
    names = dict(re.findall(r"^ *\\set (\w+) (\w+)$", roles_sql, flags=re.M))
    owner, reader, warehouse_db = names["owner"], names["reader"], names["warehouse_db"]
    dagster_db, schema = names["dagster_db"], names["schema"]
    code_port = services["code"]["command"][services["code"]["command"].index("-p") + 1]
    for name in ("init", "code", "webserver", "daemon", "webhooks"):
        service = services[name]
        env = service["environment"]
        # One image, one DAGSTER_HOME holding deploy/dagster.yaml and workspace.yaml.
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}, name
        assert service["working_dir"] == env["DAGSTER_HOME"] == "/opt/dagster/home", name
        # Dagster's storage (psycopg2 scheme) and the warehouse on the postgres service, as
        # the owner role; `changewatch sql` as the reader.
        assert env["DAGSTER_PG_URL"].startswith(f"postgresql+psycopg2://{owner}:"), name
        assert env["DAGSTER_PG_URL"].endswith(f"@postgres:5432/{dagster_db}"), name
        assert env["CHANGEWATCH_WAREHOUSE_URL"].startswith(f"postgresql://{owner}:"), name
        warehouse = f"@postgres:5432/{warehouse_db}?schema={schema}"
        assert env["CHANGEWATCH_WAREHOUSE_URL"].endswith(warehouse), name
        assert env["READER_URL"].startswith(f"postgresql://{reader}:"), name
        assert env["READER_URL"].endswith(warehouse), name
        # workspace.yaml reaches the code server by these.
        assert (env["CHANGEWATCH_CODE_HOST"], env["CHANGEWATCH_CODE_PORT"]) == ("code", code_port)
        # Passwords come from the host's environment (required), never written in the file.
        assert "${CHANGEWATCH_DB_PASSWORD:?" in env["DAGSTER_PG_URL"], name
        assert "${CHANGEWATCH_READER_PASSWORD:?" in env["READER_URL"], name
        # The user's own watches file (required), and a volume for the outputs beside it.
        watches, outputs = service["volumes"]
        assert watches.startswith("${CHANGEWATCH_WATCHES:?"), name
        assert watches.endswith(f":{env['CHANGEWATCH_CONFIG']}:ro"), name
        assert outputs == "outputs:/opt/changewatch/.changewatch", name
    assert "outputs" in compose()["volumes"]
    # The docs' deploy block says where the watches file goes, where compose mounts it.
    exported = documented_environment()
    assert exported["CHANGEWATCH_CONFIG"] == services["code"]["environment"]["CHANGEWATCH_CONFIG"]
    assert exported["CHANGEWATCH_CODE_PORT"] == code_port
    # The webhook receiver writes the inbox the code server's sensor and runs read: a file in
    # the volume both mount.
    inbox = services["webhooks"]["environment"]["CHANGEWATCH_WEBHOOK_INBOX"]
    assert inbox == services["code"]["environment"]["CHANGEWATCH_WEBHOOK_INBOX"]
    assert inbox.startswith("/opt/changewatch/.changewatch/")
    assert services["webhooks"]["command"][:2] == ["changewatch", "webhooks"]
    assert services["webhooks"]["ports"] == ["127.0.0.1:8088:8088"]
    assert services["code"]["depends_on"] == {
        "init": {"condition": "service_completed_successfully"}
    }
    assert services["init"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    # The code server's health check, a command of the installed Dagster.
    check = services["code"]["healthcheck"]["test"]
    assert check == ["CMD", "dagster", "api", "grpc-health-check", "-p", code_port]
    done = subprocess.run([str(BIN / "dagster"), *check[2:4], "--help"], capture_output=True)
    assert done.returncode == 0, done.stderr
    for name in ("webserver", "daemon"):
        assert services[name]["depends_on"] == {"code": {"condition": "service_healthy"}}
    assert services["webserver"]["ports"] == ["3000:3000"]

    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY deploy/dagster.yaml deploy/workspace.yaml /opt/dagster/home/" in dockerfile

    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text(encoding="utf-8"))
    assert workspace == {
        "load_from": [
            {
                "grpc_server": {
                    "host": {"env": "CHANGEWATCH_CODE_HOST"},
                    "port": {"env": "CHANGEWATCH_CODE_PORT"},
                    "location_name": "changewatch",
                }
            }
        ]
    }


def test_deploy_dagster_yaml_is_an_instance_on_postgres(tmp_path, monkeypatch, dagster_db):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_db)

    with dg.DagsterInstance.get() as instance:
        # Dagster's PostgreSQL storages (pooled: pipeline/definitions/postgres_storage.py).
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert type(instance.compute_log_manager).__name__ == "NoOpComputeLogManager"
        assert instance.get_runs() == []
        # Runs and event logs keep their connections: 30 queries of each open a few, not 60.
        before = sessions_opened(dagster_db)
        for _ in range(30):
            instance.get_runs()
            instance.event_log_storage.get_concurrency_keys()
        assert sessions_opened(dagster_db) - before < 10
        # Pools: one slot each unless set; the documented one-off step sets the delivery pool.
        assert instance.event_log_storage.get_pool_config().default_pool_limit == 1
        instance.event_log_storage.set_concurrency_slots("warehouse/notifications", 1)
        assert instance.event_log_storage.get_concurrency_keys() == {"warehouse/notifications"}
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert instance.run_coordinator.dequeue_interval_seconds == 1
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 8
        assert [dict(limit) for limit in queue.tag_concurrency_limits] == [
            {"key": SOURCE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
        ]
        assert instance.get_settings("telemetry")["enabled"] is False
        # The kept connections outlive the server ending them (as a restart of the database
        # does): the next queries take new ones instead of failing on the dead ones.
        assert terminate_sessions(dagster_db) >= 2
        assert instance.get_runs() == []
        assert instance.event_log_storage.get_concurrency_keys() == {"warehouse/notifications"}
    # Closing the instance closes them (the code server makes an instance per sensor tick).
    assert sessions_open(dagster_db) == 0
    # Nothing was written under DAGSTER_HOME but the settings: all state is in PostgreSQL.
    assert sorted(p.name for p in Path(home).iterdir()) == ["dagster.yaml"]


def sessions_opened(url: str) -> int:
    """How many sessions the database of ``url`` has had (PostgreSQL's own count)."""
    database = urlsplit(url).path.lstrip("/")
    # A session's count reaches the statistics within a second (PostgreSQL flushes them so).
    time.sleep(1.2)
    with closing(psycopg2.connect(url.replace("+psycopg2", ""))) as conn, conn.cursor() as cur:
        cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,))
        return cur.fetchone()[0]


def terminate_sessions(url: str) -> int:
    """End every other session of the database of ``url`` from the server's side."""
    database = urlsplit(url).path.lstrip("/")
    with closing(psycopg2.connect(url.replace("+psycopg2", ""))) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        return cur.fetchone()[0]


def sessions_open(url: str, settle_s: float = 5.0) -> int:
    """How many sessions are connected to the database of ``url``, besides this query's.

    A backend leaves ``pg_stat_activity`` a moment after its client hangs up (it sees the
    closed socket, then exits), so the count is asked again for up to ``settle_s`` seconds
    until it is 0; what it shows then is a session still open."""
    database = urlsplit(url).path.lstrip("/")
    deadline = time.monotonic() + settle_s
    with closing(psycopg2.connect(url.replace("+psycopg2", ""))) as conn, conn.cursor() as cur:
        conn.autocommit = True  # each count sees the activity of its own moment
        while True:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            count = cur.fetchone()[0]
            if count == 0 or time.monotonic() > deadline:
                return count
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local(command: list[str], **options: str) -> list[str]:
    """A documented command with its host/port options replaced, its program run from this
    venv (after an ``env NAME=value`` prefix, which stays)."""
    at = 0
    while command[at] == "env" or "=" in command[at]:
        at += 1
    command = [*command[:at], str(BIN / command[at]), *command[at + 1 :]]
    for flag, value in options.items():
        command[command.index(flag) + 1] = value
    return command


def test_code_server_webserver_and_daemon_run_a_batch_whose_syncs_overlap(
    tmp_path, monkeypatch, dagster_db, pg_url, two_trackers
):
    trackers = two_trackers
    home = tmp_path / "home"
    home.mkdir()
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(DEPLOY / name, home / name)
    config = write_watches(tmp_path / "watches.yaml", trackers)
    code_port, web_port = free_port(), free_port()
    settings = {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": dagster_db,
        "CHANGEWATCH_CONFIG": str(config),
        "CHANGEWATCH_WAREHOUSE_URL": pg_url,
        "CHANGEWATCH_CODE_HOST": "127.0.0.1",
        "CHANGEWATCH_CODE_PORT": str(code_port),
    }
    for key, value in settings.items():
        monkeypatch.setenv(key, value)  # this process reads the same instance
    env = os.environ | settings
    init, code, web, daemon = documented_commands()
    subprocess.run(local(init), env=env, cwd=home, check=True, capture_output=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    with ExitStack() as stack:
        procs = {}
        for name, command in (
            ("code", local(code, **{"-h": "127.0.0.1", "-p": str(code_port)})),
            ("webserver", local(web, **{"-h": "127.0.0.1", "-p": str(web_port)})),
            ("daemon", local(daemon)),
        ):
            out = stack.enter_context((logs / f"{name}.log").open("w"))
            procs[name] = subprocess.Popen(
                command, env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT
            )
            stack.callback(stop, procs[name])

        def alive() -> str:
            assert all(p.poll() is None for p in procs.values()), "\n".join(
                f"== {p.name}\n{p.read_text()[-3000:]}" for p in logs.iterdir()
            )
            return ""

        def pids() -> list[int]:
            return [p.pid for p in procs.values()]

        def webserver_up() -> bool:
            alive()
            try:
                info = httpx.get(f"http://127.0.0.1:{web_port}/server_info", timeout=5).json()
            except httpx.HTTPError:
                return False
            return "dagster_webserver_version" in info

        # How long a process takes to load Dagster and the code location on this machine now:
        # the yardstick of the waits below (a run worker does the same before it syncs).
        started = wait_working(webserver_up, pids=pids, what="the webserver")
        # `env` gave the daemon its allocator setting and became the daemon (same process).
        daemon_env = Path(f"/proc/{procs['daemon'].pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=2" in daemon_env
        code_env = Path(f"/proc/{procs['code'].pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=2" not in code_env  # from the daemon's command, not ours
        with gate(pg_url, list(trackers)) as waiting:
            # The daemon's sensor finds both sources due at one tick and requests one batched
            # run (its first tick may come a sensor interval later); the run queue launches it
            # through the code server, and its two syncs, on threads of the run's process
            # of its one step (a PostgreSQL warehouse), reach their commit together.
            wait_working(
                lambda: alive() or waiting() == len(trackers),
                pids=pids,
                progress=waiting,
                limit=SENSOR_INTERVAL_S + 3 * started + STALL_S,
                what="both syncs writing at the same time (progress: how many were)",
            )
        # The gate is open: the run finishes, recorded in the shared instance.
        with dg.DagsterInstance.get() as instance:

            def finished() -> bool:
                runs = instance.get_runs()
                return len(runs) == 1 and runs[0].is_finished

            wait_working(finished, pids=pids, limit=3 * started + STALL_S, what="the batch run")
            (run,) = instance.get_runs()
            # The batch's one step (pipeline/assets/batched_syncs.py).
            assert (run.job_name, run.status) == (BATCH_JOB, dg.DagsterRunStatus.SUCCESS), alive()
            assert run.tags["changewatch/batch_size"] == str(len(trackers))
    with connect(pg_url) as wh:
        for name, server in trackers.items():
            assert wh.fetch(f'SELECT count(*) FROM "{name}_changes"') == [(len(server.tracker),)]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
