"""Fleet targets synced one by one into one table, on DuckDB and PostgreSQL: each target keeps
its own state, and a target's snapshot deletes only its own rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from changewatch.sources import build_source
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.fleet import member
from changewatch.sources.github import GitHubSourceConfig
from changewatch.sources.rest import RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync

REPOS = ["acme/a", "acme/b"]


@pytest.fixture
def two_repos() -> Iterator[DemoAPIServer]:
    """One loopback API serving two repositories' issues (30 and 20)."""
    first, second = (
        DemoTracker(issues=n, seed=s, repo=r)
        for n, s, r in zip((30, 20), (1, 2), REPOS, strict=True)
    )
    with DemoAPIServer(first, more=[second]) as server:
        yield server


def rest_fleet(api: DemoAPIServer, **overrides: Any) -> RestSourceConfig:
    settings: dict[str, Any] = {
        "name": "team_issues",
        "type": "rest",
        "table": "team_issues",
        "base_url": api.url,
        "path": "/repos/{target}/issues",
        "params": {"state": "all", "per_page": 100},
        "paginator": {"type": "link_header"},
        "for_each": {"values": REPOS},
        "target_column": "repo",
        "primary_key": "number",
        "updated_at": "updated_at",
        "columns": {"number": "bigint", "title": "text", "updated_at": "timestamp"},
        "baseline": "evaluate",
    }
    return RestSourceConfig.model_validate(settings | overrides)


def sync(wh: Any, config: Any, target: str) -> Any:
    return run_sync(wh, build_source(member(config, target)))


def per_repo(wh: Any) -> dict[str, int]:
    rows = wh.fetch("SELECT repo, count(*) FROM team_issues GROUP BY repo ORDER BY repo")
    return dict(rows)


def test_targets_share_a_table_and_keep_their_own_state(
    warehouse_url: str, two_repos: DemoAPIServer
) -> None:
    config = rest_fleet(two_repos)
    with connect(warehouse_url) as wh:
        assert sync(wh, config, "acme/a").inserted == 30
        assert sync(wh, config, "acme/b").inserted == 20
        assert per_repo(wh) == {"acme/a": 30, "acme/b": 20}
        state = wh.fetch("SELECT source, row_count FROM sync_state ORDER BY source")
        assert state == [("team_issues[acme/a]", 30), ("team_issues[acme/b]", 20)]
        # Both trackers number their issues from 1: the target in the key keeps them apart.
        assert wh.fetch("SELECT count(*) FROM team_issues WHERE number = 1")[0][0] == 2
        # Nothing changed upstream: each target's sync is quiet (and deletes nothing).
        assert sync(wh, config, "acme/b").changed == 0
        assert sync(wh, config, "acme/a").changed == 0
        runs = wh.fetch("SELECT source, count(*) FROM sync_runs GROUP BY source ORDER BY source")
        assert runs == [("team_issues[acme/a]", 2), ("team_issues[acme/b]", 2)]


def test_each_stored_record_carries_its_target_over_a_field_of_that_name(
    warehouse_url: str, two_repos: DemoAPIServer
) -> None:
    # Upstream issues have a `state` field: as the target column, the target replaces it.
    config = rest_fleet(two_repos, target_column="state")
    with connect(warehouse_url) as wh:
        for repo in REPOS:
            sync(wh, config, repo)
        rows = wh.fetch("SELECT state, _raw FROM team_issues ORDER BY state, number")
        assert [state for state, _ in rows] == ["acme/a"] * 30 + ["acme/b"] * 20
        raws = [orjson.loads(raw) for _, raw in rows]
        assert [raw["state"] for raw in raws] == [state for state, _ in rows]
        assert all(raw["title"] for raw in raws)  # the rest of the record as it came
        # Stamped the same way each time: nothing reads as changed.
        assert sync(wh, config, "acme/a").changed == 0


def test_a_targets_snapshot_deletes_only_its_own_rows(
    warehouse_url: str, two_repos: DemoAPIServer
) -> None:
    config = rest_fleet(two_repos)
    with connect(warehouse_url) as wh:
        for repo in REPOS:
            sync(wh, config, repo)
        gone = two_repos.trackers["acme/a"].mutate(delete=3, update=2)
        stats = sync(wh, config, "acme/a")
        assert (stats.deleted, stats.updated, stats.row_count) == (3, 2, 27)
        assert per_repo(wh) == {"acme/a": 27, "acme/b": 20}
        # The change log names each change's target, so watches over the fleet see which.
        deletes = wh.fetch(
            "SELECT old_repo, old_number FROM team_issues_changes WHERE kind = 'delete' "
            "ORDER BY old_number"
        )
        assert deletes == [("acme/a", n) for n in sorted(gone["deleted"])]
        # Target b's listing does not hold a's rows, and its sync deletes none of them.
        assert sync(wh, config, "acme/b").changed == 0
        assert per_repo(wh) == {"acme/a": 27, "acme/b": 20}


def test_incremental_targets_keep_their_own_cursor(
    warehouse_url: str, two_repos: DemoAPIServer
) -> None:
    config = rest_fleet(
        two_repos,
        sync="incremental",
        incremental={"param": "since"},
        params={"state": "all", "per_page": 100, "sort": "updated", "direction": "asc"},
    )
    with connect(warehouse_url) as wh:
        for repo in REPOS:
            sync(wh, config, repo)
        cursors = dict(wh.fetch("SELECT source, cursor_value FROM sync_state"))
        two_repos.trackers["acme/b"].mutate(update=4)
        assert sync(wh, config, "acme/b").updated == 4
        assert sync(wh, config, "acme/a").changed == 0
        after = dict(wh.fetch("SELECT source, cursor_value FROM sync_state"))
        assert after["team_issues[acme/a]"] == cursors["team_issues[acme/a]"]
        assert after["team_issues[acme/b]"] > cursors["team_issues[acme/b]"]


def test_a_github_fleet_syncs_one_repository_per_target(
    warehouse_url: str, two_repos: DemoAPIServer
) -> None:
    config = GitHubSourceConfig.model_validate(
        {
            "name": "gh",
            "type": "github",
            "table": "gh_issues",
            "base_url": two_repos.url,
            "repos": REPOS,
            "fleet": True,
            "sync": "snapshot",
        }
    )
    with connect(warehouse_url) as wh:
        sync(wh, config, "acme/a")
        sync(wh, config, "acme/b")
        two_repos.trackers["acme/b"].mutate(delete=2)
        assert sync(wh, config, "acme/b").deleted == 2
        counts = dict(wh.fetch("SELECT repo, count(*) FROM gh_issues GROUP BY repo"))
        assert counts == {"acme/a": 30, "acme/b": 18}
