"""The GitHub issues source: every configured repository's issues through the REST machinery."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from changewatch.sources.base import DocumentSink, FetchResult, Validator
from changewatch.sources.errors import PayloadError, SourceError
from changewatch.sources.github.config import GitHubSourceConfig
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.limits import Deadline
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.sources.rest.source import ClientFactory

__all__ = ["API_VERSION", "GitHubSource", "build_github_source"]

API_VERSION = "2022-11-28"
HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION}
# Response bounds passed on to each repository's walk when the config sets them.
_BOUNDS = ("max_response_bytes", "response_timeout")


def _rest_config(config: GitHubSourceConfig, repo: str) -> RestSourceConfig:
    """The REST walk over one repository's ``/issues`` listing."""
    walk = RestSourceConfig.model_validate(
        {
            "name": config.owner,  # a valid name; a fleet target's own is set below
            "type": "rest",
            "table": config.table,
            "primary_key": config.primary_key,
            "updated_at": config.updated_at,
            "columns": {name: spec.model_dump() for name, spec in config.columns.items()},
            "sync": config.sync,
            "base_url": config.base_url,
            "path": f"/repos/{repo}/issues",
            # Newest change first: anything new lands on page 1, so page 1 answering 304
            # proves the whole listing unchanged, even where a 304 carries no Link header.
            "params": {
                "state": "all",
                "sort": "updated",
                "direction": "desc",
                "per_page": config.per_page,
            },
            "headers": HEADERS,
            "paginator": {"type": "link_header"},
            "incremental": {"param": "since", "format": "iso", "lag": config.lag},
            "auth": {"type": "bearer", "token_env": config.token_env} if config.token_env else None,
            "page_limit": config.page_limit,
            "sync_timeout": config.sync_timeout,
            # Only those the file sets, so a policy given in code keeps the others.
            **{name: getattr(config, name) for name in _BOUNDS if name in config.model_fields_set},
        }
    )
    # Errors name what syncs: the source, or a fleet's target (`<fleet>[<owner/name>]`).
    return walk.model_copy(update={"name": config.name})


def github_time(cursor: str) -> str:
    """The stored ISO-8601 cursor as GitHub writes times: ``2026-01-02T10:00:00Z`` (UTC).

    >>> github_time("2026-01-02T12:00:00.5+02:00")
    '2026-01-02T10:00:00Z'
    """
    try:
        moment = datetime.fromisoformat(cursor)
    except ValueError:
        raise SourceError(f"stored cursor {cursor!r} is not an ISO-8601 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # cursors are stored in UTC
    # Dropping fractions moves `since` earlier, never later: nothing is skipped.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GitHubSource:
    """A ``Source`` over the issues (and pull requests) of ``config.repos``.

    Each repository is one Link-header walk of ``/repos/{owner}/{name}/issues`` through
    ``RestSource`` (so through the shared HTTP policy: budgets, 304s, retries). Records are
    GitHub's issue objects plus ``repo`` ("owner/name" as configured) and ``is_pull_request``.
    A failure in any repository fails the whole fetch: nothing partial is returned.
    """

    def __init__(
        self,
        config: GitHubSourceConfig,
        *,
        policy: HttpPolicy | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.config = config
        self.policy = policy or HttpPolicy()
        self.client_factory = client_factory or HttpClient
        self._walks = {
            repo: RestSource(
                _rest_config(config, repo), policy=self.policy, client_factory=self.client_factory
            )
            for repo in config.repos or ()
        }

    def fetch(
        self,
        *,
        cursor: str | None,
        validators: Mapping[str, Validator] | None = None,
        sink: DocumentSink | None = None,
    ) -> FetchResult:
        """Every repository's issues (changed since ``cursor`` when incremental), or raise.

        Validators are per page URL, so one mapping serves every repository. All answered
        304: ``not_modified``. In a snapshot, a repository answering 304 while another changed
        is fetched again unconditionally, so the result holds the full listing
        (``complete=True``) and deletes can be seen. Pages reach ``sink`` annotated, as they
        arrive. ``sync_timeout`` bounds all repositories' walks together.
        """
        deadline = Deadline.after(self.config.sync_timeout)
        since = github_time(cursor) if cursor and self.config.sync == "incremental" else None
        # Per repository: its pages (only without a sink, which holds them instead) and
        # their records. A repository fetched again replaces its entry.
        kept: dict[str, list[tuple[bytes | None, int]]] = {repo: [] for repo in self._walks}

        def keeper(repo: str) -> DocumentSink:
            def keep(document: bytes, records_path: str | None) -> None:
                annotated, records = self._annotate(document, repo)
                kept[repo].append((None if sink is not None else annotated, records))
                if sink is not None:
                    sink(annotated, None)

            return keep

        results = {
            repo: walk.fetch(
                cursor=since, validators=validators, sink=keeper(repo), deadline=deadline
            )
            for repo, walk in self._walks.items()
        }
        if self.config.sync == "snapshot" and not all(r.not_modified for r in results.values()):
            for repo, result in results.items():
                if result.not_modified:
                    again = self._walks[repo].fetch(
                        cursor=None, sink=keeper(repo), deadline=deadline
                    )
                    again.requests += result.requests
                    results[repo] = again
        documents = [doc for pages in kept.values() for doc, _ in pages if doc is not None]
        streamed = sum(len(pages) for pages in kept.values()) if sink is not None else 0
        count = sum(records for pages in kept.values() for _, records in pages)
        found: dict[str, Validator] = {}
        for result in results.values():
            found.update(result.validators)
        not_modified = all(r.not_modified for r in results.values())
        return FetchResult(
            documents=documents,
            record_count=count,
            pages=sum(r.pages for r in results.values()),
            requests=sum(r.requests for r in results.values()),
            complete=self.config.sync == "snapshot" and not not_modified,
            validators=found,
            not_modified=not_modified,
            notes={"not_modified_repos": [r for r, res in results.items() if res.not_modified]},
            streamed=streamed,
        )

    def _annotate(self, document: bytes, repo: str) -> tuple[bytes, int]:
        """One page with ``repo`` and ``is_pull_request`` added (and pull requests dropped
        unless ``include_pull_requests``), and its number of records."""
        try:
            issues: Any = orjson.loads(document)
        except orjson.JSONDecodeError:
            issues = None
        if not isinstance(issues, list) or not all(isinstance(i, dict) for i in issues):
            raise PayloadError(
                f"source {self.config.name!r}: GET /repos/{repo}/issues did not return a JSON "
                "array of issues"
            )
        kept = []
        for issue in issues:
            is_pull_request = issue.get("pull_request") is not None
            if is_pull_request and not self.config.include_pull_requests:
                continue
            issue["repo"] = repo
            issue["is_pull_request"] = is_pull_request
            kept.append(issue)
        return orjson.dumps(kept), len(kept)


def build_github_source(
    config: GitHubSourceConfig | Mapping[str, Any], **options: Any
) -> GitHubSource:
    """A ``GitHubSource`` from a validated config or a raw mapping (validated here)."""
    if not isinstance(config, GitHubSourceConfig):
        config = GitHubSourceConfig.model_validate(config)
    return GitHubSource(config, **options)
