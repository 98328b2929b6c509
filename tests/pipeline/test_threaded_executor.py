"""The threaded executor of batched runs, run for real through `dg.execute_job` (which uses a
job's own executor; `materialize` and `execute_in_process` would swap in the in-process one).

Steps meet at a barrier that only overlapping steps can pass, so "they ran at once" cannot
pass by luck; one job's failing step shows that a failure stays its own; two steps of one pool
show the pool is claimed; and the batch job of two real sources (one down) runs on PostgreSQL.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.definitions.build_definitions import SYNC_JOB, build_definitions
from changewatch.pipeline.definitions.threaded_executor import (
    threaded_executor,
    threads_from_env,
)
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import connect
from cw_testing import PG_URL

MEET_S = 60.0  # how long a step waits for the other at the barrier before giving up
_meeting = threading.Barrier(2, timeout=MEET_S)
_in_pool: list[str] = []
_overlaps: list[str] = []


@dg.op
def meet_a() -> None:
    _meeting.wait()


@dg.op
def meet_b() -> None:
    _meeting.wait()


@dg.op
def fails() -> int:
    raise RuntimeError("this step fails")


@dg.op
def after_failure(value: int) -> None:
    del value


def _pooled(name: str) -> dg.OpDefinition:
    @dg.op(name=name, pool="one_at_a_time")
    def _op() -> None:
        if _in_pool:
            _overlaps.append(name)
        _in_pool.append(name)
        time.sleep(0.3)
        _in_pool.remove(name)

    return _op


@dg.job(executor_def=threaded_executor.configured({"max_concurrent": 2}))
def overlapping() -> None:
    meet_a()
    meet_b()


@dg.job(executor_def=threaded_executor.configured({"max_concurrent": 4}))
def one_fails() -> None:
    meet_a()
    meet_b()
    after_failure(fails())


@dg.job(executor_def=threaded_executor.configured({"max_concurrent": 4}))
def pooled() -> None:
    _pooled("first")()
    _pooled("second")()


def batch_job() -> dg.JobDefinition:
    """The batch job of the watches file in CHANGEWATCH_CONFIG, as the code server builds it."""
    defs = build_definitions(load_config(Path(os.environ["CHANGEWATCH_CONFIG"])))
    return defs.resolve_job_def(SYNC_JOB)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def test_steps_run_at_once(instance):
    _meeting.reset()
    result = dg.execute_job(dg.reconstructable(overlapping), instance=instance)
    # Each step waits at the barrier for the other: had they run one after another, the first
    # would have given up after MEET_S and failed.
    assert result.success
    assert not _meeting.broken


def test_a_failed_step_fails_alone(instance):
    _meeting.reset()
    result = dg.execute_job(dg.reconstructable(one_fails), instance=instance, raise_on_error=False)
    assert not result.success
    events = result.all_events
    failed = {e.step_key for e in events if e.event_type_value == "STEP_FAILURE"}
    succeeded = {e.step_key for e in events if e.event_type_value == "STEP_SUCCESS"}
    started = {e.step_key for e in events if e.event_type_value == "STEP_START"}
    assert failed == {"fails"}
    assert succeeded == {"meet_a", "meet_b"}
    assert started == {"fails", "meet_a", "meet_b"}  # not the step after the failed one


def test_steps_of_one_pool_wait_for_each_other(instance):
    instance.event_log_storage.set_concurrency_slots("one_at_a_time", 1)
    result = dg.execute_job(dg.reconstructable(pooled), instance=instance)
    assert result.success
    assert _overlaps == []


def test_concurrency_comes_from_the_environment():
    assert threads_from_env({}) == 4
    assert threads_from_env({"CHANGEWATCH_SYNC_CONCURRENCY": "2"}) == 2
    with pytest.raises(ValueError, match="CHANGEWATCH_SYNC_CONCURRENCY must be a whole number"):
        threads_from_env({"CHANGEWATCH_SYNC_CONCURRENCY": "0"})


def source(name: str, base_url: str) -> dict:
    return {
        "name": name,
        "type": "rest",
        "base_url": base_url,
        "path": "/repos/acme/widgets/issues",
        "params": {"state": "all", "per_page": 100},
        "paginator": {"type": "link_header"},
        "table": name,
        "primary_key": "number",
        "updated_at": "updated_at",
        "interval": "5m",
        "columns": {"number": "bigint", "title": "text", "updated_at": "timestamp"},
    }


def test_the_batch_job_syncs_its_sources_on_threads_on_postgres(
    tmp_path, instance, monkeypatch, dead_port
):
    schema = f"cw_test_threads_{os.getpid()}_{int(time.time())}"
    url = f"{PG_URL}?schema={schema}"
    with (
        DemoAPIServer(DemoTracker(issues=40, seed=1)) as one,
        DemoAPIServer(DemoTracker(issues=30, seed=2)) as two,
    ):
        config = tmp_path / "watches.yaml"
        sources = [
            source("alpha", one.url),
            source("beta", two.url),
            source("down", f"http://127.0.0.1:{dead_port}"),
        ]
        config.write_text(yaml.safe_dump({"version": 1, "sources": sources}), encoding="utf-8")
        monkeypatch.setenv("CHANGEWATCH_CONFIG", str(config))
        monkeypatch.setenv(WAREHOUSE_URL_ENV, url)
        try:
            result = dg.execute_job(
                dg.reconstructable(batch_job), instance=instance, raise_on_error=False
            )
            started = [
                e.message
                for e in result.all_events
                if e.event_type_value == "ENGINE_EVENT" and "on threads" in (e.message or "")
            ]
            assert started, "the batch ran on the in-process executor"
            failed = {e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"}
            assert failed == {"down"}
            with connect(url) as warehouse:
                assert warehouse.fetch("SELECT count(*) FROM alpha") == [(40,)]
                assert warehouse.fetch("SELECT count(*) FROM beta") == [(30,)]
        finally:
            import adbc_driver_postgresql.dbapi as adbc

            with adbc.connect(PG_URL) as con, con.cursor() as cur:
                cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                con.commit()


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A bound port nobody listens on: connections are refused."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
