"""Connectors: each turns a source's settings into raw records, and normalization types them.

``SourceConfig`` is the union of every connector's settings (told apart by ``type``);
``build_source`` makes the connector for one.
"""

from __future__ import annotations

from typing import Annotated

from changewatch.sources.base import ColumnSpec, FetchResult, Source, SourceBase
from changewatch.sources.errors import FetchError, PayloadError, SourceError
from changewatch.sources.feed import FeedSource, FeedSourceConfig
from changewatch.sources.github import GitHubSource, GitHubSourceConfig
from changewatch.sources.rest import RestSource, RestSourceConfig
from pydantic import Field

__all__ = [
    "ColumnSpec",
    "FetchError",
    "FetchResult",
    "PayloadError",
    "Source",
    "SourceBase",
    "SourceConfig",
    "SourceError",
    "build_source",
]

# Every connector's settings, told apart by `type`.
SourceConfig = Annotated[
    RestSourceConfig | GitHubSourceConfig | FeedSourceConfig, Field(discriminator="type")
]


def build_source(config: SourceConfig) -> Source:
    """The connector for ``config``."""
    if isinstance(config, RestSourceConfig):
        return RestSource(config)
    if isinstance(config, FeedSourceConfig):
        return FeedSource(config)
    if isinstance(config, GitHubSourceConfig):
        return GitHubSource(config)
    raise TypeError(f"no connector for source type {config.type!r}")
