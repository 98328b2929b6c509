"""The feed source's change probe: the feed itself, conditionally (one request is all a feed
sync makes too, so the probe saves the run, not the request)."""

from __future__ import annotations

from changewatch.sources.feed.config import FeedSourceConfig
from changewatch.sources.feed.parse import FEED_ACCEPT
from changewatch.sources.probe import ProbeRequest
from changewatch.sources.rest.auth import credentials

__all__ = ["feed_probe_requests"]


def feed_probe_requests(config: FeedSourceConfig) -> list[ProbeRequest]:
    """The feed's GET, with the headers and credentials its sync sends."""
    auth_headers, auth_params = credentials(config.auth)
    return [
        ProbeRequest(
            key="",
            url=config.url,
            params=dict(auth_params),
            headers={"Accept": FEED_ACCEPT, **config.headers, **auth_headers},
            secrets=(*auth_headers, *auth_params),
        )
    ]
