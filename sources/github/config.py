"""Settings of a GitHub issues source: which repositories, and a token's env var name."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from changewatch.sources.base import Duration, EnvVarName, SourceBase
from changewatch.sources.limits import DEFAULT_PAGE_LIMIT
from changewatch.sources.targets import query_tables, schedule_problem
from pydantic import Field, field_validator, model_validator

__all__ = ["DEFAULT_COLUMNS", "GitHubSourceConfig"]

# What a source that declares no `columns` stores (see sources/github/README.md); declaring
# `columns` replaces the whole set. `repo` and `is_pull_request` are added by the connector.
DEFAULT_COLUMNS: dict[str, Any] = {
    "repo": "text",
    "number": "bigint",
    "id": "bigint",
    "title": "text",
    "body": "text",
    "state": "text",
    "state_reason": "text",
    "is_pull_request": "boolean",
    "author": {"type": "text", "path": "user.login"},
    "assignees": {"type": "text[]", "path": "assignees[].login"},
    "labels": {"type": "text[]", "path": "labels[].name"},
    "milestone": {"type": "text", "path": "milestone.title"},
    "comments": "integer",
    "locked": "boolean",
    "created_at": "timestamp",
    "updated_at": "timestamp",
    "closed_at": "timestamp",
    "html_url": "text",
}

_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


class GitHubSourceConfig(SourceBase):
    """Issues (and pull requests) of one or more GitHub repositories.

    Only ``name``, ``type``, ``table`` and ``repos`` are required. Defaults: primary key
    ``[repo, number]``, ``sync: incremental`` on ``updated_at`` (GitHub's ``since``),
    ``DEFAULT_COLUMNS``.
    """

    type: Literal["github"] = Field(description="GitHub issues and pull requests.")
    repos: list[str] | None = Field(
        default=None, min_length=1, description="The repositories, as `owner/name`."
    )
    # A fleet (sources/fleet.py): each repository synced on its own (its own cursor and
    # validators, a partition of the source's asset), into the one table keyed by `repo`.
    fleet: bool = Field(
        default=False,
        description="Sync each repository on its own (its own cursor, a partition of the asset).",
    )
    # The repositories of a fleet read from the warehouse (first column of a read of synced
    # tables, e.g. an organization's repository listing), by each run of the fleet.
    repos_query: str | None = Field(
        default=None,
        description=(
            "A fleet's repositories read from the warehouse: a SELECT over synced tables, first "
            "column."
        ),
    )
    # The NAME of the environment variable holding a token; None: anonymous (60 requests/h).
    token_env: EnvVarName | None = Field(
        default=None,
        description=(
            "The environment variable holding a token; unset: anonymous (60 requests an hour)."
        ),
    )
    base_url: str = Field(
        default="https://api.github.com",
        description="The API's origin (GitHub Enterprise: its API URL).",
    )
    per_page: int = Field(default=100, ge=1, le=100, description="Issues per page (at most 100).")
    include_pull_requests: bool = Field(
        default=True, description="Keep pull requests, which GitHub lists as issues."
    )
    # Most pages of one repository's walk.
    page_limit: int = Field(
        default=DEFAULT_PAGE_LIMIT, gt=0, description="Most pages of one repository's walk."
    )
    # Sent `since` is the cursor minus this. Repositories are walked one after another under
    # one cursor (the newest change seen in any of them), so an update made in a repository
    # already walked, older than another's newest, would fall behind the cursor; the lag,
    # with dedupe by primary key and content hash, picks such late rows up.
    lag: Duration = Field(
        default=600.0,
        ge=0,
        description=(
            "Subtracted from the cursor sent as `since`, to pick up late updates across "
            "repositories."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _github_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data.setdefault("columns", dict(DEFAULT_COLUMNS))
        data.setdefault("primary_key", ["repo", "number"])
        data.setdefault("sync", "incremental")
        columns = data["columns"]
        if "updated_at" not in data and isinstance(columns, dict) and "updated_at" in columns:
            data["updated_at"] = "updated_at"
        return data

    @field_validator("repos")
    @classmethod
    def _owner_slash_name(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        bad = [repo for repo in value if not isinstance(repo, str) or not _REPO.match(repo)]
        if bad:
            raise ValueError(f"repos must look like 'owner/name', got {bad}")
        seen = {repo.lower() for repo in value}
        if len(seen) != len(value):
            raise ValueError("repos lists a repository twice")
        return value

    @field_validator("repos_query")
    @classmethod
    def _a_read(cls, value: str | None) -> str | None:
        if value is not None:
            query_tables(value)
        return value

    @model_validator(mode="after")
    def _repos_given(self) -> GitHubSourceConfig:
        if (self.repos is None) == (self.repos_query is None):
            raise ValueError("give either repos: [owner/name, ...] or repos_query: SELECT ...")
        if self.repos_query is not None:
            self.fleet = True  # targets known only in a run: each is a partition of its own
        if self.fleet and ("repo" not in self.columns or "repo" not in self.primary_key):
            raise ValueError("a fleet keys its table by repository: keep repo in primary_key")
        if self.fleet and (problem := schedule_problem(self.cron, self.reconcile)) is not None:
            raise ValueError(problem)
        return self

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {value!r}")
        if parts.query or parts.username or parts.password:
            raise ValueError("base_url must hold no query string or credentials")
        return value.rstrip("/")

    def env_vars(self) -> list[str]:
        """The token's environment variable name, when there is one."""
        return [self.token_env] if self.token_env else []
