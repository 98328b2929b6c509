"""Feed connector: RSS 0.9x/1.0/2.0, Atom 1.0 and JSON Feed 1.x, one record per entry."""

from __future__ import annotations

from changewatch.sources.feed.config import DEFAULT_COLUMNS, FeedSourceConfig
from changewatch.sources.feed.parse import ParsedFeed, fallback_id, parse_feed
from changewatch.sources.feed.source import FeedSource, build_feed_source

__all__ = [
    "DEFAULT_COLUMNS",
    "FeedSource",
    "FeedSourceConfig",
    "ParsedFeed",
    "build_feed_source",
    "fallback_id",
    "parse_feed",
]
