"""Pagination styles, each written once: which page to fetch first, and which next."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urljoin, urlsplit

import httpx
import orjson
from changewatch.sources.errors import FetchError, PayloadError
from changewatch.sources.rest.config import (
    CursorPagination,
    LinkHeaderPagination,
    NextUrlPagination,
    NoPagination,
    OffsetPagination,
    PageNumberPagination,
    PaginatorConfig,
)

MISSING: Any = object()


def lookup(body: Any, path: str) -> Any:
    """The value at dotted ``path`` (``data.items``, ``pages.0.next``) in ``body``, or MISSING."""
    value = body
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _absent(value: Any) -> bool:
    return value is MISSING or value is None or value == ""


def _count(body: Any, path: str) -> int:
    value = lookup(body, path)
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise PayloadError(f"{path!r} should be a whole number, got {value!r}")
    return int(value)


# What identifies a record across pages (for overlap checks): a primary key, or the record.
RecordKey = Callable[[dict[str, Any]], Any]


def whole_record(record: dict[str, Any]) -> bytes:
    """A record's own identity when nothing better is known: its JSON, keys sorted."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True)
class PageRequest:
    """One page to fetch: a URL and query params merged into its query string."""

    url: str
    params: dict[str, Any] = field(default_factory=dict)


class Paginator(Protocol):
    """One walk over an endpoint's pages; make a new one per fetch (it keeps state)."""

    # Whether `next` looks at the decoded body and records; when not, the walk skips decoding
    # and normalization parses each page once, in bulk.
    reads_body: bool
    # Whether a walk can go on past a 304 Not Modified (no body): the next page comes from
    # the headers, or there is none. Only such walks send validators (conditional requests).
    conditional: bool

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        """The first page's request."""
        ...

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        """The request after ``page`` (given its response, decoded body and records), or None."""
        ...


class SinglePage:
    """No pagination: one request."""

    reads_body = True  # one page: checking its shape here costs nothing
    conditional = True

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        return PageRequest(url, params)

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        return None


class PageNumber:
    """``page=start, start+1, ...`` until a short/empty page or the reported page count."""

    reads_body = True
    conditional = False

    def __init__(self, config: PageNumberPagination) -> None:
        self.config = config

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        c = self.config
        params = {**params, c.page_param: c.start}
        if c.page_size_param is not None:
            params[c.page_size_param] = c.page_size
        return PageRequest(url, params)

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        c = self.config
        number = int(page.params[c.page_param])
        if not records and c.stop_on_empty:
            return None
        if c.page_size is not None and len(records) < c.page_size:
            return None
        if c.total_pages_path is not None and number - c.start + 1 >= _count(
            body, c.total_pages_path
        ):
            return None
        return PageRequest(page.url, {**page.params, c.page_param: number + 1})


class Offset:
    """``offset=0, limit, 2*limit, ...`` until a short/empty page or the reported total.

    With ``overlap: N`` each page starts N rows early and must contain one of the previous
    page's last N rows (compared by ``key``). If none is there, rows shifted past the walk
    (deleted or moved ahead of it) and it steps back 1, 2, 4, ... strides until one shows up
    again or it is back at offset 0; ``MAX_STEPS_BACK`` in a row fail the walk.
    """

    reads_body = True
    conditional = False
    MAX_STEPS_BACK = 20

    def __init__(self, config: OffsetPagination, key: RecordKey = whole_record) -> None:
        self.config = config
        self.key = key
        self._tail: set[Any] = set()  # keys of the last accepted page's overlap rows
        self._steps_back = 0

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        c = self.config
        return PageRequest(url, {**params, c.offset_param: 0, c.limit_param: c.limit})

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        c = self.config
        offset = int(page.params[c.offset_param])
        stride = c.limit - c.overlap
        if self._tail and offset > 0 and self._tail.isdisjoint(map(self.key, records)):
            # Rows shifted by `overlap` or more since the last page: what came between is
            # unknown, so read back until the last page's tail shows up (or offset 0).
            self._steps_back += 1
            if self._steps_back > self.MAX_STEPS_BACK:
                raise FetchError(
                    f"the listing kept shifting while it was paged ({self.MAX_STEPS_BACK} "
                    "steps back): raise the paginator's overlap, or sync when it is quieter"
                )
            back = stride * 2 ** (self._steps_back - 1)
            return PageRequest(page.url, {**page.params, c.offset_param: max(0, offset - back)})
        self._steps_back = 0
        if len(records) < c.limit:
            return None
        if c.overlap:
            self._tail = {self.key(record) for record in records[-c.overlap :]}
        if c.total_path is not None and offset + len(records) >= _count(body, c.total_path):
            return None
        return PageRequest(page.url, {**page.params, c.offset_param: offset + stride})


class _FollowUrls:
    """Shared by styles that follow server-given URLs: refuses to fetch one URL twice."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        return self._visit(url, params)

    def _visit(self, url: str, params: dict[str, Any]) -> PageRequest:
        # urllib, not httpx.URL: this runs once per page and httpx's parser costs ~0.1 ms.
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        query += [(str(k), str(v)) for k, v in params.items()]
        # Compare with the query sorted: a server may reorder parameters in its links.
        key = (f"{parts.scheme}://{parts.netloc}{parts.path}", tuple(sorted(query)))
        if key in self._seen:
            # Path only: a next link may carry credentials in its query string.
            raise FetchError(f"pagination loop: the next page {parts.path} was already fetched")
        self._seen.add(key)
        return PageRequest(url, params)


class LinkHeader(_FollowUrls):
    """Follow ``Link: <url>; rel="next"`` until there is none.

    Also on a 304 (which has no body): a server must repeat ``Link`` there, or the walk ends.
    """

    reads_body = False
    conditional = True

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        if not link.startswith(("http://", "https://")):
            link = urljoin(str(response.url), link)
        return self._visit(link, {})


class NextUrl(_FollowUrls):
    """Follow the URL at ``next_url_path`` in the body until it is missing or empty."""

    reads_body = True
    conditional = False

    def __init__(self, config: NextUrlPagination) -> None:
        super().__init__()
        self.config = config

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        link = lookup(body, self.config.next_url_path)
        if _absent(link):
            return None
        if not isinstance(link, str):
            raise PayloadError(f"{self.config.next_url_path!r} should be a URL, got {link!r}")
        return self._visit(str(response.url.join(link)), {})


class Cursor:
    """Send the body's next cursor back as a query parameter until it is missing or empty."""

    reads_body = True
    conditional = False

    def __init__(self, config: CursorPagination) -> None:
        self.config = config
        self._seen: set[str] = set()

    def first(self, url: str, params: dict[str, Any]) -> PageRequest:
        return PageRequest(url, params)

    def next(
        self, page: PageRequest, response: httpx.Response, body: Any, records: list[Any]
    ) -> PageRequest | None:
        c = self.config
        cursor = lookup(body, c.cursor_path)
        if _absent(cursor):
            return None
        if isinstance(cursor, bool) or not isinstance(cursor, str | int):
            raise PayloadError(f"{c.cursor_path!r} should be a string, got {cursor!r}")
        if str(cursor) in self._seen:
            raise FetchError(f"pagination loop: cursor at {c.cursor_path!r} repeated")
        self._seen.add(str(cursor))
        return PageRequest(page.url, {**page.params, c.cursor_param: str(cursor)})


def make_paginator(config: PaginatorConfig, key: RecordKey = whole_record) -> Paginator:
    """A fresh paginator (one per walk) for a ``paginator:`` setting.

    ``key`` tells records apart for offset ``overlap`` checks (the primary key, usually).
    """
    if isinstance(config, NoPagination):
        return SinglePage()
    if isinstance(config, PageNumberPagination):
        return PageNumber(config)
    if isinstance(config, OffsetPagination):
        return Offset(config, key)
    if isinstance(config, LinkHeaderPagination):
        return LinkHeader()
    if isinstance(config, NextUrlPagination):
        return NextUrl(config)
    if isinstance(config, CursorPagination):
        return Cursor(config)
    raise TypeError(f"unknown paginator {config!r}")
