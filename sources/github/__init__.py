"""GitHub connector: the issues and pull requests of one or more repositories."""

from __future__ import annotations

from changewatch.sources.github.config import DEFAULT_COLUMNS, GitHubSourceConfig
from changewatch.sources.github.source import GitHubSource, build_github_source

__all__ = ["DEFAULT_COLUMNS", "GitHubSource", "GitHubSourceConfig", "build_github_source"]
