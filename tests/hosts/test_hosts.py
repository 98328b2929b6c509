"""changewatch on several hosts: runs placed on worker hosts by Dagster (dagster-celery), a
worker host lost mid-run, the db host's PostgreSQL restarted (tests/hosts/deployment.py).

Root only (network namespaces): `pytest -m hosts tests/hosts -n 0`, as .ci/run does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from deployment import Deployment

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with Deployment(workers=2, sources=4) as deployed:
        yield deployed


def run_rows(d: Deployment) -> list[tuple[str, str, str]]:
    """(run id, status, celery worker node) of every run, from Dagster's storage."""
    return d.query(
        "SELECT r.run_id, r.status, coalesce(t.value, '') FROM runs r LEFT JOIN run_tags t"
        " ON t.run_id = r.run_id AND t.key = 'dagster-celery/task_id' ORDER BY r.id",
        database="dagster",
    )


def changes(d: Deployment) -> Counter:
    """How many times each (source, kind, key) change was recorded."""
    found: Counter = Counter()
    for name in d.trackers:
        exists = d.query("SELECT to_regclass(%s) IS NOT NULL", args=(f"cw.{name}_changes",))
        if exists[0][0]:
            for kind, key in d.query(f'SELECT kind, object_key FROM "{name}_changes"'):
                found[(name, kind, int(key))] += 1
    return found


def expected_inserts(d: Deployment) -> set[tuple[str, str, int]]:
    return {
        (name, "insert", issue["number"])
        for name, server in d.trackers.items()
        for issue in server.tracker.snapshot()
    }


def test_runs_are_placed_on_both_worker_hosts(deployment):
    d = deployment
    want = expected_inserts(d)
    d.wait(lambda: set(changes(d)) >= want, "every source's first sync", progress=lambda: len(changes(d)))
    workers = {
        line.split("Task ")[0]
        for w in d.workers
        for line in d.log(w.name).splitlines()
        if "execute_job" in line and "succeeded" in line
    }
    assert workers, d.logs_tail()
