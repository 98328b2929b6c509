"""The REST source's change probe: the first page of its listing, as its sync would ask it.

Only the first page is asked. An incremental source's probe sends ``since`` (its previous
probe's time, less a margin), so any change shows there; a snapshot's is exact for a one-page
listing or one sorted newest-first, and a change further down waits for the source's
``probe.reconcile`` sync. A source
with a parent listing has no probe (its children's pages hold the changes): it syncs at its
interval.
"""

from __future__ import annotations

import functools

from changewatch.sources.probe import ProbeRequest
from changewatch.sources.rest.auth import credentials
from changewatch.sources.rest.config import RestSourceConfig
from changewatch.sources.rest.paginators import make_paginator
from changewatch.sources.rest.source import cursor_param

__all__ = ["rest_probe_requests"]


def rest_probe_requests(config: RestSourceConfig) -> list[ProbeRequest] | None:
    """The first page's request of ``config``'s listing, or None for a source with a parent
    listing."""
    if config.parent is not None:
        return None
    first = make_paginator(config.paginator).first(config.url, dict(config.params))
    auth_headers, auth_params = credentials(config.auth)
    incremental = config.incremental if config.sync == "incremental" else None
    return [
        ProbeRequest(
            key="",
            url=first.url,
            params={**first.params, **auth_params},
            headers={**config.headers, **auth_headers},
            secrets=(*auth_headers, *auth_params),
            since=(
                (incremental.param, functools.partial(cursor_param, incremental=incremental))
                if incremental is not None
                else None
            ),
        )
    ]
