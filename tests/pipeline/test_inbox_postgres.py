"""The webhook inbox in PostgreSQL (several hosts): the real server, real receivers on
loopback, the webhook sensor against a real Dagster instance; the same contract as the file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import httpx
import pytest
import yaml
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import SYNC_JOB
from changewatch.pipeline.triggers.webhook_sensor import WEBHOOK_SENSOR
from changewatch.pipeline.webhooks.webhook_inbox import DAGSTER_PG_ENV, INBOX_ENV, Inbox, open_inbox
from changewatch.pipeline.webhooks.webhook_inbox_postgres import PostgresInbox
from changewatch.pipeline.webhooks.webhook_receiver import WebhookReceiver
from changewatch.sources.demo import DemoAPIServer
from cw_testing import PG_URL, demo_source_settings, fresh_database

SECRET = "inbox-pg-s3cret"
WHERE = (
    "on the disk of whichever host runs it (Dagster's storage is PostgreSQL): use a webhook, "
    "email or chat channel, or a folder every host mounts"
)
SECRET_ENV = "CW_TEST_INBOX_PG_SECRET"


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database("cw_inbox") as url:
        yield url


def put(inbox: PostgresInbox | Inbox, source: str, delivery: str) -> bool:
    return inbox.put(source, delivery, provider="standard", event=None, body=b"{}")


def test_the_environment_picks_the_inbox(tmp_path: Path) -> None:
    file = str(tmp_path / "in.sqlite")
    dagster = "postgresql+psycopg2://cw:pw@db:5432/dagster"
    assert isinstance(open_inbox({}), Inbox)
    assert open_inbox({INBOX_ENV: file}).location == file
    # Dagster's storage in PostgreSQL (several hosts): the inbox goes there, named without
    # its password.
    chosen = open_inbox({DAGSTER_PG_ENV: dagster})
    assert isinstance(chosen, PostgresInbox)
    assert chosen.url == "postgresql://cw:pw@db:5432/dagster"
    assert chosen.location == "postgresql://cw@db:5432/dagster"
    assert "pw" not in repr(chosen)
    # An explicit choice wins either way.
    assert isinstance(open_inbox({INBOX_ENV: file, DAGSTER_PG_ENV: dagster}), Inbox)
    explicit = open_inbox({INBOX_ENV: "postgresql://cw@other/inbox", DAGSTER_PG_ENV: dagster})
    assert explicit.url == "postgresql://cw@other/inbox"
    # One per process and URL: a sensor ticking every second keeps its connection.
    assert open_inbox({DAGSTER_PG_ENV: dagster}) is chosen


def test_deliveries_are_stored_once_covered_and_pruned(database: str) -> None:
    with PostgresInbox(database) as inbox, PostgresInbox(database) as other:
        check_contract(inbox, other)


def check_contract(inbox: PostgresInbox, other: PostgresInbox) -> None:
    assert inbox.last_seq() == 0 and inbox.pending() == []
    assert put(inbox, "alpha", "early")
    assert not put(inbox, "alpha", "early")  # a provider's retry adds nothing
    covered = inbox.watermark("alpha")  # the sync begins fetching here
    assert put(inbox, "alpha", "late")
    assert put(inbox, "beta", "other")
    assert inbox.consume("alpha", covered, by="run-1") == 1
    assert [(p.source, p.delivery_id) for p in inbox.pending()] == [
        ("alpha", "late"),
        ("beta", "other"),
    ]
    assert [p.delivery_id for p in inbox.pending(after=inbox.pending()[0].seq)] == ["other"]
    # Consumed deliveries are kept a while (a late retry is still a duplicate), then pruned;
    # the sequence never goes back, so a sensor's cursor stays valid.
    last = inbox.last_seq()
    assert not put(inbox, "alpha", "early")
    inbox.consume("beta", inbox.watermark("beta"), by="run-2", now=time.time() + 31 * 86400)
    assert put(inbox, "alpha", "early")
    assert inbox.last_seq() > last
    # Another process (a worker host) sees the same rows.
    assert [p.delivery_id for p in other.pending()] == ["late", "early"]


def test_a_tailing_reader_never_skips_a_delivery_of_concurrent_writers(database: str) -> None:
    """Four receivers (their own connections) store 150 deliveries each while a sensor tails
    the inbox by its cursor, as the webhook sensor does: it sees every one."""
    writers = [PostgresInbox(database) for _ in range(4)]
    put(writers[0], "warmup", "w")  # the table exists before the race starts
    done = threading.Event()
    seen: set[str] = set()

    def write(index: int) -> None:
        for n in range(150):
            put(writers[index], "alpha", f"{index}-{n}")

    def tail() -> None:
        cursor = 0
        with PostgresInbox(database) as reader:
            while True:
                finished = done.is_set()
                batch = reader.pending(after=cursor)
                seen.update(item.delivery_id for item in batch)
                cursor = max((item.seq for item in batch), default=cursor)
                if finished and not batch:
                    return

    tailer = threading.Thread(target=tail)
    tailer.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    tailer.join(timeout=60)
    for writer in writers:
        writer.close()
    expected = {f"{i}-{n}" for i in range(4) for n in range(150)}
    assert expected - seen == set()


def signed(body: bytes, delivery: str) -> dict[str, str]:
    mac = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "issues",
    }


def write_config(folder: Path, base_url: str) -> Path:
    source = demo_source_settings(
        base_url,
        {"number": "bigint", "comments": "integer", "updated_at": "timestamp"},
        name="alpha",
        table="alpha",
        baseline="silent",
        webhook={"path": "/hooks/alpha", "secret_env": SECRET_ENV, "provider": "github"},
    )
    config = {"version": 1, "sources": [source]}
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_receiver_sensor_and_run_share_the_inbox_through_postgres(
    tmp_path: Path,
    database: str,
    demo_api: DemoAPIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No file anywhere: the receiver stores into Dagster's database, the sensor reads it, the
    run consumes what it covered; with the server unreachable the receiver answers 503."""
    schema = f"cw_wh_{time.time_ns()}"
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"{PG_URL}?schema={schema}")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.delenv(INBOX_ENV, raising=False)
    monkeypatch.setenv(DAGSTER_PG_ENV, database.replace("postgresql://", "postgresql+psycopg2://"))
    monkeypatch.chdir(tmp_path)
    config = load_config(write_config(tmp_path, demo_api.url))
    defs = build_definitions(config)
    body = json.dumps({"action": "edited", "issue": {"number": 3}}).encode()
    with WebhookReceiver(config.sources, inbox=open_inbox(), port=0) as receiver:
        url = f"{receiver.url}/hooks/alpha"
        assert httpx.post(url, content=body, headers=signed(body, "d-1")).status_code == 202
        assert httpx.post(url, content=body, headers=signed(body, "d-1")).status_code == 200
    assert not list(tmp_path.glob("**/*.sqlite"))

    with dg.instance_for_test() as instance:
        sensor = defs.resolve_sensor_def(WEBHOOK_SENSOR)
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        [request] = sensor.evaluate_tick(context).run_requests
        job = defs.resolve_job_def(SYNC_JOB)
        assert job.execute_in_process(instance=instance, tags=request.tags).success
    shared = open_inbox()
    assert shared.pending() == []
    shared.close()

    down = PostgresInbox("postgresql://postgres@127.0.0.1:1/none")
    with WebhookReceiver(config.sources, inbox=down, port=0) as receiver:
        answer = httpx.post(
            f"{receiver.url}/hooks/alpha", content=body, headers=signed(body, "d-2")
        )
    assert answer.status_code == 503
    assert answer.json() == {"error": "not stored; try again"}


def test_validate_names_files_that_several_hosts_would_split(tmp_path: Path) -> None:
    """The bundled watches file writes a file channel and a digest folder: on one host that
    is fine; with Dagster's storage in PostgreSQL, validate names both and says what instead."""
    import os
    import subprocess
    import sys

    from cw_testing import REPO

    command = [sys.executable, "-m", "changewatch.pipeline.cli", "--config"]
    command += [str(REPO / "watches.yaml"), "validate"]
    env = {k: v for k, v in os.environ.items() if k != DAGSTER_PG_ENV}
    alone = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert alone.returncode == 0 and "warning" not in alone.stdout
    env[DAGSTER_PG_ENV] = "postgresql+psycopg2://cw:pw@db:5432/dagster"
    spread = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert (spread.returncode, spread.stderr) == (0, "")
    warnings = [line for line in spread.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: channel 'notifications_file' writes {REPO}/.changewatch/notifications.jsonl"
        f" {WHERE}",
        f"warning: digest 'daily' writes {REPO}/.changewatch/digests {WHERE}",
    ]
    assert "pw" not in spread.stdout
