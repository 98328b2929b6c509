"""A fleet's settings: what the file may say, and the config of each target."""

from __future__ import annotations

from typing import Any

import pytest
from changewatch.sources.fleet import is_fleet, listed_targets, member, targets_query
from changewatch.sources.github import GitHubSourceConfig
from changewatch.sources.probe import probe_requests
from changewatch.sources.rest import RestSourceConfig
from pydantic import ValidationError


def rest(**overrides: Any) -> RestSourceConfig:
    settings: dict[str, Any] = {
        "name": "tenants",
        "type": "rest",
        "table": "tenant_orders",
        "base_url": "https://api.example.com",
        "path": "/v1/{target}/orders",
        "params": {"region": "{target}", "limit": 50},
        "for_each": {"values": ["eu west", "us"]},
        "primary_key": "id",
        "columns": {"id": "bigint", "total": "double"},
    }
    return RestSourceConfig.model_validate(settings | overrides)


def refused(make: Any, **overrides: Any) -> str:
    with pytest.raises(ValidationError) as error:
        make(**overrides)
    return str(error.value)


def test_a_rest_fleet_adds_its_target_column_in_front_of_the_key() -> None:
    config = rest()
    assert is_fleet(config) and listed_targets(config) == ["eu west", "us"]
    assert config.primary_key == ["target", "id"]
    assert config.columns["target"].type == "text"
    one = member(config, "eu west")
    # Escaped in the path, as it is in params (httpx escapes those when it sends them).
    assert one.url == "https://api.example.com/v1/eu%20west/orders"
    assert one.params == {"region": "eu west", "limit": 50}
    assert (one.name, one.owner, not is_fleet(one)) == ("tenants[eu west]", "tenants", True)
    # Each target is probed with its own first page.
    assert [r.key for r in probe_requests(config) or []] == ["eu west", "us"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"path": "/v1/orders", "params": {}}, "no {target} in the path or params"),
        ({"path": "/v1/{targets}/orders", "params": {}}, "(found '{targets}')"),
        ({"columns": {"id": "bigint", "target": "text"}}, "is the fleet's target_column"),
        ({"for_each": {"values": ["a", "a"]}}, "values lists a target twice"),
        ({"for_each": {"values": ["a...b"]}}, "which a Dagster partition key cannot"),
        ({"for_each": {"values": ["a"], "query": "SELECT 1 FROM t"}}, "either values"),
        ({"for_each": {"query": "DELETE FROM t"}}, "must be one SELECT"),
        ({"for_each": {"query": "SELECT 1"}}, "reads no table"),
        ({"cron": "0 * * * *"}, "cron: and reconcile: are not supported for fleets"),
        ({"for_each": None}, "{target} placeholders need for_each"),
    ],
)
def test_a_rest_fleet_refuses(overrides: dict[str, Any], reason: str) -> None:
    assert reason in refused(rest, **overrides)


def github(**overrides: Any) -> GitHubSourceConfig:
    settings = {"name": "gh", "type": "github", "table": "gh_issues"}
    return GitHubSourceConfig.model_validate(settings | overrides)


def test_a_github_fleet_is_asked_for_or_read_from_a_query() -> None:
    assert not is_fleet(github(repos=["acme/a", "acme/b"]))  # one sync of every repository
    assert is_fleet(github(repos=["acme/a"], fleet=True))
    by_query = github(repos_query="SELECT full_name FROM org_repos")
    assert is_fleet(by_query) and listed_targets(by_query) is None
    assert targets_query(by_query) == "SELECT full_name FROM org_repos"
    one = member(by_query, "acme/b")
    assert (one.name, one.repos, one.target_scope.column) == ("gh[acme/b]", ["acme/b"], "repo")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({}, "give either repos"),
        ({"repos": ["a/b"], "repos_query": "SELECT x FROM t"}, "give either repos"),
        ({"repos": ["a/b"], "fleet": True, "primary_key": "id"}, "keep repo in primary_key"),
        ({"repos_query": "SELECT x FROM t", "reconcile": "0 3 * * *"}, "not supported for"),
    ],
)
def test_a_github_fleet_refuses(overrides: dict[str, Any], reason: str) -> None:
    assert reason in refused(github, **overrides)
