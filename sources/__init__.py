"""Connectors: each turns a source's settings into raw records, and normalization types them.

``SourceConfig`` is the union of every connector's settings (told apart by ``type``);
``build_source`` makes the connector for one.
"""

from __future__ import annotations

from sources.base import ColumnSpec, FetchResult, Source, SourceBase
from sources.errors import FetchError, PayloadError, SourceError
from sources.rest import RestSource, RestSourceConfig

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

# One member today; github and feed connectors join this union (discriminated by `type`).
SourceConfig = RestSourceConfig


def build_source(config: SourceConfig) -> Source:
    """The connector for ``config``."""
    if isinstance(config, RestSourceConfig):
        return RestSource(config)
    raise TypeError(f"no connector for source type {config.type!r}")
