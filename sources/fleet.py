"""Fleet sources: one entry in watches.yaml for many similar targets, synced target by target.

Where it sits: between the config and the sync. A fleet (a ``rest`` source with ``for_each``,
a ``github`` source with ``fleet: true`` or ``repos_query``) writes one table with the target
as a column of its primary key. Each target syncs as a source of its own: the fleet's config
with the target filled in and a ``TargetScope`` (``member``), so it keeps its own cursor,
validators and run records (under ``<fleet>[<target>]``), and its snapshot compares, counts
and deletes its own rows only; it shares the fleet's lock and payload fields. Targets are the
file's list, or the first column of a query over synced tables, which only a run reads
(``pipeline/triggers/fleet_assets.py``).
"""

from __future__ import annotations

from dataclasses import replace

from changewatch.sources.base import SourceBase, TargetScope
from changewatch.sources.github.config import GitHubSourceConfig
from changewatch.sources.probe import ProbeRequest
from changewatch.sources.rest.config import RestSourceConfig
from changewatch.sources.targets import fill_target, query_tables

__all__ = [
    "fleet_probe_requests",
    "is_fleet",
    "listed_targets",
    "member",
    "member_name",
    "query_problem",
    "target_column",
    "targets_query",
]


def is_fleet(config: SourceBase) -> bool:
    """Whether ``config`` is a fleet (synced per target), not one target or a plain source."""
    if isinstance(config, RestSourceConfig):
        return config.for_each is not None
    return isinstance(config, GitHubSourceConfig) and config.fleet


def target_column(config: SourceBase) -> str:
    """The column holding each row's target: ``target_column`` (REST) or ``repo`` (GitHub)."""
    return config.target_column if isinstance(config, RestSourceConfig) else "repo"


def listed_targets(config: SourceBase) -> list[str] | None:
    """The fleet's targets as the file lists them; None when a query gives them."""
    if isinstance(config, RestSourceConfig) and config.for_each is not None:
        return list(config.for_each.values) if config.for_each.values is not None else None
    if isinstance(config, GitHubSourceConfig):
        return list(config.repos) if config.repos is not None else None
    return None


def targets_query(config: SourceBase) -> str | None:
    """The SQL whose first column gives the fleet's targets, if a query gives them."""
    if isinstance(config, RestSourceConfig) and config.for_each is not None:
        return config.for_each.query
    if isinstance(config, GitHubSourceConfig):
        return config.repos_query
    return None


def query_problem(config: SourceBase, tables: set[str]) -> tuple[tuple, str] | None:
    """Where and why a fleet's targets query reads a table no source of the file writes (or
    the fleet's own), or None. ``tables``: the file's source tables.

    >>> from changewatch.sources.github import GitHubSourceConfig
    >>> fleet = GitHubSourceConfig.model_validate({"name": "gh", "type": "github",
    ...     "table": "gh_issues", "repos_query": "SELECT full_name FROM org_repo"})
    >>> query_problem(fleet, {"org_repos", "gh_issues"})
    (('repos_query',), "table 'org_repo' is no source's table (sources write: org_repos)")
    """
    query = targets_query(config)
    if query is None:
        return None
    where = ("repos_query",) if isinstance(config, GitHubSourceConfig) else ("for_each", "query")
    readable = tables - {config.table}
    for table in query_tables(query):
        if table not in readable and table.removesuffix("_changes") not in readable:
            known = ", ".join(sorted(readable)) or "none"
            return where, f"table {table!r} is no source's table (sources write: {known})"
    return None


def member_name(fleet: str, target: str) -> str:
    """The name one target's syncs are recorded under (``sync_state``, ``sync_runs``).

    >>> member_name("team_issues", "acme/widgets")
    'team_issues[acme/widgets]'
    """
    return f"{fleet}[{target}]"


def member(config: SourceBase, target: str) -> SourceBase:
    """The config that syncs ``target`` of fleet ``config`` (see the module docstring)."""
    name = member_name(config.name, target)
    if isinstance(config, RestSourceConfig):
        one: SourceBase = config.model_copy(
            update={
                "name": name,
                "path": fill_target(config.path, target, in_path=True),
                "params": {
                    k: fill_target(v, target, in_path=False) if isinstance(v, str) else v
                    for k, v in config.params.items()
                },
                "for_each": None,
            }
        )
    elif isinstance(config, GitHubSourceConfig):
        one = config.model_copy(
            update={"name": name, "repos": [target], "fleet": False, "repos_query": None}
        )
    else:
        raise TypeError(f"source {config.name!r} ({config.type}) cannot be a fleet")
    one._target = TargetScope(fleet=config.name, column=target_column(config), value=target)
    return one


def fleet_probe_requests(config: SourceBase) -> list[ProbeRequest] | None:
    """Each listed target's probe requests, keyed by target (``<target>`` or
    ``<target> <key>``), or None when the targets' type has no probe."""
    from changewatch.sources.probe import probe_requests

    found: list[ProbeRequest] = []
    for target in listed_targets(config) or []:
        requests = probe_requests(member(config, target))
        if requests is None:
            return None
        found += [replace(r, key=_key(target, r.key)) for r in requests]
    return found


def _key(target: str, key: str) -> str:
    """A target's probe request key: the target, and its own key if it is another.

    >>> _key("acme/a", ""), _key("acme/a", "acme/a"), _key("eu", "page")
    ('acme/a', 'acme/a', 'eu page')
    """
    return target if key in ("", target) else f"{target} {key}"
