"""GitHub sync end to end on DuckDB and Postgres: validators stored with the rows, an unchanged
poll costs only 304s (and no rate budget), a change is picked up, a sweep finds deletes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from changewatch.sources.github import build_github_source
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.ratelimit import RateLimits
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from github_server import Clock, FakeGitHub

SECRET = "ghp_syncTestToken1234"


@pytest.fixture
def api() -> Any:
    with FakeGitHub(Clock()) as server:
        yield server


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GH_SYNC_TOKEN", SECRET)


def source(api: FakeGitHub, limits: RateLimits) -> Any:
    config = {
        "name": "gh",
        "type": "github",
        "table": "gh_issues",
        "repos": ["acme/widgets"],
        "token_env": "GH_SYNC_TOKEN",
        "base_url": api.base_url,
        "per_page": 2,
    }

    def factory(**options: Any) -> HttpClient:
        return HttpClient(
            now=api.clock.now, sleep=api.clock.sleep, rng=random.Random(1), limits=limits, **options
        )

    return build_github_source(config, policy=HttpPolicy(max_retries=1), client_factory=factory)


def test_unchanged_polls_are_all_304_and_cost_no_budget(
    warehouse_url: str, api: FakeGitHub
) -> None:
    for number in range(1, 6):
        api.add_issue("acme/widgets", number, f"2024-05-0{number}T00:00:00Z")
    limits = RateLimits()
    with connect(warehouse_url) as wh:
        first = run_sync(wh, source(api, limits))
        stored = wh.fetch("SELECT count(*) FROM http_validators WHERE source = 'gh'")[0][0]
    assert first.inserted == 5 and stored == first.pages == 3
    # The first incremental poll asks `since` the new cursor: a different URL, so a 200 (with
    # just the newest issue again, unchanged). From then on the same URL answers 304.
    with connect(warehouse_url) as wh:
        settle = run_sync(wh, source(api, limits))
    assert (settle.changed, settle.not_modified) == (0, False)
    spent = dict(api.counters.spent)
    requests_before = api.counters.requests

    with connect(warehouse_url) as wh:
        second = run_sync(wh, source(api, limits))
    assert second.not_modified and second.changed == 0
    assert api.counters.not_modified == api.counters.requests - requests_before >= 1
    assert api.counters.spent == spent  # 304s spend nothing in the server's accounting

    api.add_issue("acme/widgets", 3, "2024-05-20T00:00:00Z", title="renamed")
    with connect(warehouse_url) as wh:
        third = run_sync(wh, source(api, limits))
        title = wh.fetch("SELECT title FROM gh_issues WHERE number = 3")[0][0]
    assert (third.updated, third.inserted, third.not_modified) == (1, 0, False)
    assert title == "renamed"


def test_sweep_finds_what_the_incremental_walk_cannot(warehouse_url: str, api: FakeGitHub) -> None:
    for number in range(1, 4):
        api.add_issue("acme/widgets", number, f"2024-05-0{number}T00:00:00Z")
    limits = RateLimits()
    with connect(warehouse_url) as wh:
        run_sync(wh, source(api, limits))
        api.remove_issue("acme/widgets", 2)
        assert run_sync(wh, source(api, limits)).deleted == 0
        sweep = run_sync(wh, source(api, limits), full=True)
        assert sweep.deleted == 1
        numbers = [r[0] for r in wh.fetch("SELECT number FROM gh_issues ORDER BY number")]
    assert numbers == [1, 3]
