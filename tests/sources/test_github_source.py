"""GitHubSource against the fake GitHub on loopback: walks, since, 304s, budgets, secrecy."""

from __future__ import annotations

import functools
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from changewatch.sources.base import FetchResult
from changewatch.sources.errors import FetchError, RateLimited
from changewatch.sources.github import GitHubSource, GitHubSourceConfig, build_github_source
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.normalize import normalize
from changewatch.sources.ratelimit import RateLimits
from github_server import Clock, FakeGitHub
from pydantic import ValidationError

SECRET = "ghp_s3cr3tT0kenValue9876"
SYNCED_AT = datetime(2024, 6, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(clock: Clock):
    with FakeGitHub(clock) as server:
        yield server


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GH_TOKEN", SECRET)
    return SECRET


def make_source(api: FakeGitHub, **settings: Any) -> GitHubSource:
    """A source named ``gh`` over ``acme/widgets`` on the fake server; sleeps move its clock."""
    config = {
        "name": "gh",
        "type": "github",
        "table": "gh_issues",
        "repos": ["acme/widgets"],
        "token_env": "GH_TOKEN",
        "base_url": api.base_url,
        **settings,
    }
    factory = functools.partial(
        HttpClient,
        now=api.clock.now,
        sleep=api.clock.sleep,
        rng=random.Random(3),
        limits=RateLimits(),  # one registry per source: tests don't share budgets
    )
    return build_github_source(config, policy=HttpPolicy(max_retries=2), client_factory=factory)


def day(n: int, hour: int = 0) -> str:
    return f"2024-05-{n:02d}T{hour:02d}:00:00Z"


def fill(api: FakeGitHub, repo: str, count: int, *, first_day: int = 1) -> None:
    for number in range(1, count + 1):
        api.add_issue(repo, number, day(first_day + number - 1))


def keys(result) -> list[tuple[str, int]]:
    return [(r["repo"], r["number"]) for r in result.records()]


def issue_requests(api: FakeGitHub) -> list:
    return [r for r in api.received if r.path.endswith("/issues")]


# --- walks ------------------------------------------------------------------------------------


def test_walks_every_page_of_every_repo(api):
    fill(api, "acme/widgets", 5)
    fill(api, "acme/gadgets", 3)
    source = make_source(api, repos=["acme/widgets", "acme/gadgets"], per_page=2)
    result = source.fetch(cursor=None)
    assert sorted(keys(result)) == [("acme/gadgets", n) for n in range(1, 4)] + [
        ("acme/widgets", n) for n in range(1, 6)
    ]
    assert keys(result)[:5] == [("acme/widgets", n) for n in range(5, 0, -1)]  # newest first
    assert result.pages == 5 and result.requests == 5 and result.record_count == 8
    assert result.complete is False and result.not_modified is False  # incremental
    for request in api.received:
        assert request.query["state"] == "all"
        assert request.query["sort"] == "updated" and request.query["direction"] == "desc"
        assert request.query["per_page"] == "2"
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["authorization"] == f"Bearer {SECRET}"
        assert "since" not in request.query
    assert [r.query.get("page") for r in api.received] == [None, "2", "3", None, "2"]
    frame = normalize(result, source.config, synced_at=SYNCED_AT)
    assert frame.height == 8
    row = frame.filter(frame["repo"] == "acme/gadgets").sort("number").row(0, named=True)
    assert row["number"] == 1 and row["author"] == "octocat" and row["is_pull_request"] is False


def test_since_cursor_is_sent_in_github_form(api):
    fill(api, "acme/widgets", 6)
    result = make_source(api, lag=0).fetch(cursor="2024-05-04T02:00:00.250+02:00")
    assert {r.query["since"] for r in api.received} == {"2024-05-04T00:00:00Z"}
    assert [r["number"] for r in result.records()] == [6, 5, 4]


def test_since_looks_back_by_the_lag(api):
    fill(api, "acme/widgets", 6)
    result = make_source(api).fetch(cursor="2024-05-04T00:00:00Z")  # default lag: 10 min
    assert {r.query["since"] for r in api.received} == {"2024-05-03T23:50:00Z"}
    assert [r["number"] for r in result.records()] == [6, 5, 4]


def test_rows_sharing_one_updated_at_across_page_boundaries_all_come(api):
    for number in range(1, 8):
        api.add_issue("acme/widgets", number, day(3) if number > 1 else day(1))
    result = make_source(api, per_page=2).fetch(cursor=day(3))
    assert sorted(r["number"] for r in result.records()) == [2, 3, 4, 5, 6, 7]
    assert result.pages == 3


def test_pull_requests_are_flagged_or_left_out(api):
    api.add_issue("acme/widgets", 1, day(1))
    api.add_issue("acme/widgets", 2, day(2), pull_request=True)
    flagged = make_source(api).fetch(cursor=None).records()
    assert sorted((r["number"], r["is_pull_request"]) for r in flagged) == [(1, False), (2, True)]
    issues_only = make_source(api, include_pull_requests=False).fetch(cursor=None)
    assert [r["number"] for r in issues_only.records()] == [1]
    assert issues_only.record_count == 1


# --- conditional requests ---------------------------------------------------------------------


def test_an_unchanged_poll_is_304_everywhere_and_spends_no_budget(api):
    fill(api, "acme/widgets", 5)
    fill(api, "acme/gadgets", 4)
    source = make_source(api, repos=["acme/widgets", "acme/gadgets"], per_page=2)
    cursor = day(2)
    first = source.fetch(cursor=cursor)
    assert first.not_modified is False and len(first.records()) == 7
    assert len(first.validators) == first.pages == 4
    spent, remaining = dict(api.counters.spent), api.remaining(SECRET)
    sent = len(api.received)

    again = source.fetch(cursor=cursor, validators=first.validators)
    assert again.not_modified is True
    assert again.documents == [] and again.record_count == 0 and again.complete is False
    assert again.pages == again.requests == 4  # walked on through the 304s' Link headers
    assert again.validators == first.validators
    polled = api.received[sent:]
    assert len(polled) == 4 and all("if-none-match" in r.headers for r in polled)
    assert api.counters.not_modified == 4
    assert api.counters.spent == spent and api.remaining(SECRET) == remaining


def test_a_change_is_fetched_and_unchanged_pages_stay_304(api):
    fill(api, "acme/widgets", 5)
    fill(api, "acme/gadgets", 2)
    source = make_source(api, repos=["acme/widgets", "acme/gadgets"], per_page=2)
    first = source.fetch(cursor=day(1))
    api.add_issue("acme/gadgets", 3, day(20))
    second = source.fetch(cursor=day(1), validators=first.validators)
    assert second.not_modified is False
    # Newest first: the new issue 3 leads gadgets' page 1, so gadgets is read again in full,
    # while every page of widgets answers 304.
    assert sorted(keys(second)) == [("acme/gadgets", n) for n in (1, 2, 3)]
    assert second.notes["not_modified_repos"] == ["acme/widgets"]
    assert api.counters.not_modified == 3
    assert len(second.validators) == len(first.validators) + 1


def test_snapshot_with_one_repo_changed_refetches_the_rest_for_a_full_listing(api):
    fill(api, "acme/widgets", 3)
    fill(api, "acme/gadgets", 3)
    source = make_source(api, repos=["acme/widgets", "acme/gadgets"], per_page=2, sync="snapshot")
    first = source.fetch(cursor=None)
    assert first.complete is True
    unchanged = source.fetch(cursor=None, validators=first.validators)
    assert unchanged.not_modified is True and unchanged.complete is False
    api.add_issue("acme/gadgets", 2, day(9), title="renamed")  # moves to the last page
    streamed: list[bytes] = []
    changed = source.fetch(
        cursor=None, validators=first.validators, sink=lambda doc, path: streamed.append(doc)
    )
    assert changed.complete is True and changed.not_modified is False
    # Each page of the result reached the sink once, annotated, refetched pages included;
    # the result keeps none of them.
    assert sorted(keys(FetchResult(documents=streamed))) == sorted(keys(first))
    assert changed.documents == [] and changed.streamed == len(streamed)
    assert len(changed.validators) == 4


# --- failures ---------------------------------------------------------------------------------


def test_a_5xx_on_page_2_of_3_raises_and_returns_nothing(api):
    fill(api, "acme/widgets", 6)
    api.fail_page(2, status=502, times=10)
    source = make_source(api, per_page=2)
    with pytest.raises(FetchError, match="502") as info:
        source.fetch(cursor=None)
    assert "gh" in str(info.value) and "/repos/acme/widgets/issues" in str(info.value)
    assert [r.query.get("page") for r in api.received] == [None, "2", "2", "2"]  # 2 retries
    assert len(api.clock.slept) == 2


def test_a_budget_spent_mid_walk_defers_the_whole_fetch(clock):
    with FakeGitHub(clock, limit=2, window=3600) as api:
        fill(api, "acme/widgets", 6)
        with pytest.raises(RateLimited) as info:
            make_source(api, per_page=2).fetch(cursor=None)
        assert info.value.retry_at == api.reset_at(SECRET)
        assert len(api.received) == 2
    assert clock.slept == []
    assert SECRET not in str(info.value)


def test_the_token_reaches_the_server_as_bearer_and_never_an_error(api, monkeypatch):
    api.fail_page(1, status=500, times=10)
    with pytest.raises(FetchError) as info:
        make_source(api).fetch(cursor=None)
    assert api.received[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in str(info.value) and SECRET not in repr(info.value.args)
    api.exhaust(SECRET)
    with pytest.raises(RateLimited) as limited:
        make_source(api).fetch(cursor=None)
    assert SECRET not in str(limited.value)


def test_a_missing_token_variable_is_named_before_any_request(api, monkeypatch):
    monkeypatch.delenv("GH_TOKEN")
    with pytest.raises(FetchError, match="gh.*GH_TOKEN"):
        make_source(api).fetch(cursor=None)
    assert api.received == []


def test_anonymous_without_token_env(api):
    api.add_issue("acme/widgets", 1, day(1))
    make_source(api, token_env=None).fetch(cursor=None)
    assert "authorization" not in api.received[0].headers


# --- config -----------------------------------------------------------------------------------

BASE = {"name": "gh", "type": "github", "table": "gh_issues", "repos": ["acme/widgets"]}


def test_config_defaults():
    config = GitHubSourceConfig.model_validate({**BASE, "token_env": "GITHUB_TOKEN"})
    assert config.primary_key == ["repo", "number"]
    assert config.sync == "incremental" and config.updated_at == "updated_at"
    assert config.base_url == "https://api.github.com" and config.per_page == 100
    assert config.include_pull_requests is True and config.page_limit == 50_000
    assert config.columns["labels"].path == "labels[].name"
    assert config.env_vars() == ["GITHUB_TOKEN"]
    assert GitHubSourceConfig.model_validate(BASE).env_vars() == []


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"token_env": "ghp_abc123"}, "environment variable name"),
        ({"repos": ["widgets"]}, "owner/name"),
        ({"repos": []}, "at least 1"),
        ({"repos": ["acme/w", "ACME/w"]}, "twice"),
        ({"per_page": 101}, "100"),
        ({"base_url": "ftp://x"}, "http"),
        ({"columns": {"number": "bigint", "updated_at": "timestamp"}}, "repo"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_config_rejects(settings, problem):
    with pytest.raises(ValidationError, match=problem):
        GitHubSourceConfig.model_validate({**BASE, **settings})
