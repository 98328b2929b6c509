"""Generic REST/JSON connector: config, pagination styles, auth and the source itself."""

from __future__ import annotations

from changewatch.sources.rest.config import RestSourceConfig
from changewatch.sources.rest.paginators import PageRequest, Paginator, make_paginator
from changewatch.sources.rest.source import RestSource, build_rest_source

__all__ = [
    "PageRequest",
    "Paginator",
    "RestSource",
    "RestSourceConfig",
    "build_rest_source",
    "make_paginator",
]
