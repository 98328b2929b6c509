"""The generic REST source: walks every page of a JSON endpoint (once per parent record, when
it has a parent listing) into the documents one sync normalizes."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import orjson
from changewatch.sources.base import DocumentSink, FetchResult, Validator
from changewatch.sources.errors import (
    FetchError,
    LimitExceeded,
    PayloadError,
    RateLimited,
    SourceError,
)
from changewatch.sources.http import HttpClient, HttpPolicy, validator_of
from changewatch.sources.limits import Deadline
from changewatch.sources.ratelimit import credential_id
from changewatch.sources.rest.auth import credentials
from changewatch.sources.rest.config import (
    PLACEHOLDER,
    Incremental,
    PaginatorConfig,
    RestSourceConfig,
)
from changewatch.sources.rest.paginators import (
    MISSING,
    PageRequest,
    Paginator,
    RecordKey,
    lookup,
    make_paginator,
)

ClientFactory = Callable[..., HttpClient]


def cursor_param(cursor: str, incremental: Incremental) -> str | int:
    """The stored ISO-8601 ``cursor``, minus the ``lag``, as the API wants it.

    ISO without lag: sent as stored. ISO with lag: UTC with a ``Z``. Unix: whole seconds.
    """
    if incremental.format == "iso" and not incremental.lag:
        return cursor
    try:
        moment = datetime.fromisoformat(cursor)
    except ValueError:
        raise SourceError(f"stored cursor {cursor!r} is not an ISO-8601 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # cursors are stored in UTC
    moment -= timedelta(seconds=incremental.lag)
    if incremental.format == "unix":
        return math.floor(moment.timestamp())
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


# URLs that httpx would leave exactly as written: lowercase http(s) scheme and host, no
# userinfo, no dot segments or fragment, and only characters that need no quoting. Most next
# links are such URLs, and parsing each one into an ``httpx.URL`` costs about 0.1 ms a page.
_PLAIN_URL = re.compile(
    r"https?://[a-z0-9\-]+(?:\.[a-z0-9\-]+)*(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"(?:/[A-Za-z0-9\-_~!$'()*+,;=:@/]*)?"
    r"(?:\?(?:[A-Za-z0-9\-._~!$'()*+,;=:@/?&]|%[0-9A-Fa-f]{2})*)?"
)


def request_key(request: PageRequest, secret_params: Iterable[str] = ()) -> str:
    """The key a page's validator is stored under: its URL, without credentials.

    >>> request_key(PageRequest("https://api.example.com/items?page=2", {}))
    'https://api.example.com/items?page=2'
    >>> request_key(PageRequest("https://u:pw@API.example.com:443/items", {"page": 1}))
    'https://api.example.com/items?page=1'
    """
    plain = _PLAIN_URL.fullmatch(request.url)
    if plain and not request.params and not secret_params and plain["port"] not in ("80", "443"):
        return request.url
    secret = tuple(secret_params)
    try:
        # Each value with its type: 1 and True are equal keys, but not equal in a URL.
        params = tuple((k, type(v), v) for k, v in request.params.items())
        return _known_request_key(request.url, params, secret)
    except TypeError:  # a value that is no dict key (a list): worked out each time
        return _request_key(request.url, request.params, secret)


@lru_cache(maxsize=4096)
def _known_request_key(
    url: str, params: tuple[tuple[str, type, Any], ...], secret_params: tuple[str, ...]
) -> str:
    # Asked twice a page, and again by every sync of the source: httpx's URL parsing costs
    # about a millisecond each time (bench/profile_alone.py).
    return _request_key(url, {k: v for k, _, v in params}, secret_params)


def _request_key(url: str, params: Mapping[str, Any], secret_params: Iterable[str]) -> str:
    parsed = httpx.URL(url)
    if params:
        parsed = parsed.copy_merge_params(params)
    for name in secret_params:
        parsed = parsed.copy_remove_param(name)
    return str(parsed.copy_with(userinfo=b""))


@dataclass(frozen=True)
class _Listing:
    """One endpoint walked page by page: the source's own, a child walk, or the parent."""

    url: str
    params: dict[str, Any]
    paginator: PaginatorConfig
    records_path: str | None
    # Parent fields set on every record (child walks).
    copied: dict[str, Any] = field(default_factory=dict)
    # The parent listing: its records are returned, its pages not kept, never conditional.
    parent: bool = False


@dataclass
class _Walk:
    """What one fetch has gathered so far, over all its listings."""

    stored: Mapping[str, Validator]  # validators from the last sync, by request key
    records_path: str | None = None
    sink: DocumentSink | None = None  # given each kept document at once, instead of `documents`
    documents: list[bytes] = field(default_factory=list)
    streamed: int = 0  # documents given to the sink (not kept: the sink holds what it needs)
    validators: dict[str, Validator] = field(default_factory=dict)
    pages: int = 0
    record_count: int = 0
    counted: bool = True  # every kept page was decoded, so record_count is the total
    unchanged: list[tuple[_Listing, Paginator, PageRequest]] = field(default_factory=list)
    ignored: Counter[int] = field(default_factory=Counter)  # statuses a response action took
    root: str | None = None  # the key of the walk's first request: names the walk

    def keep(self, document: bytes) -> None:
        if self.sink is None:
            self.documents.append(document)
            return
        # Not kept: a walk of a million records would otherwise hold every page until it ends.
        self.streamed += 1
        self.sink(document, self.records_path)

    @property
    def kept(self) -> int:
        return len(self.documents) + self.streamed

    def reshaped(self) -> bool:
        """Whether this walk requested other pages than the stored walk of the same root.

        Every remembered page is stored (with an empty validator when the server gave none),
        so a page that is gone (a last page whose items were deleted, a deleted parent's
        child walk) shows here even when every page left answered 304.
        """
        before = {key for key, validator in self.stored.items() if validator.walk == self.root}
        return before != self.validators.keys()


class RestSource:
    """A ``Source`` reading a paginated JSON API described by a ``RestSourceConfig``."""

    def __init__(
        self,
        config: RestSourceConfig,
        *,
        policy: HttpPolicy | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.config = config
        self.policy = (policy or HttpPolicy()).bounded_by(config)
        # Called as client_factory(policy=..., name=..., deadline=...); tests inject
        # sleep/clock this way.
        self.client_factory = client_factory or HttpClient
        self._ignore = {a.status for a in config.response_actions if a.action == "ignore"}

    def fetch(
        self,
        *,
        cursor: str | None,
        validators: Mapping[str, Validator] | None = None,
        sink: DocumentSink | None = None,
        deadline: Deadline | None = None,
    ) -> FetchResult:
        """Every page's JSON (since ``cursor`` when incremental); raises on any failure.

        The walk must end by ``deadline`` (default: ``sync_timeout`` from now) and each
        listing within ``page_limit`` pages, else ``LimitExceeded``.

        With a ``parent``, the parent listing is walked first, then the source's path once per
        distinct parent record (in listing order, one at a time, through the same client),
        each child record getting the parent's ``fields``. Responses matched by an ``ignore``
        response action end their listing without records (counted in ``notes["ignored"]``).

        With a paginator that can walk past a 304 (``conditional``: link_header, none) each
        page is requested with its stored validator, and a 304 page yields no document. All
        pages 304: ``not_modified=True``, no documents. Some 304: an incremental walk returns
        the changed pages only (the other pages' rows are stored already). A snapshot walk
        then no longer holds the full listing, and without it deletes go unseen (now, and
        forever if the next sync is all 304); so once a page has changed it asks the rest
        unconditionally and fetches the 304 pages again, returning ``complete=True``. A
        snapshot walk that is all 304 but requested other pages than the stored walk (see
        ``Validator.walk``: a page or a parent's child walk is gone) is walked again without
        validators, for the same reason.
        """
        config = self.config
        params: dict[str, Any] = dict(config.params)
        if config.sync == "incremental" and cursor and config.incremental is not None:
            with self._context():
                params[config.incremental.param] = cursor_param(cursor, config.incremental)
        snapshot = config.sync == "snapshot"
        # A fleet target's records get their target in normalization (sources/normalize.py).
        own = _Listing(config.url, params, config.paginator, config.records_path)
        conditional = make_paginator(config.paginator).conditional
        walk = _Walk((validators or {}) if conditional else {}, config.records_path, sink)
        deadline = deadline or Deadline.after(config.sync_timeout)
        with self.client_factory(policy=self.policy, name=config.name, deadline=deadline) as client:
            for listing in self._listings(client, walk, own):
                self._walk(client, walk, listing)
            if snapshot and walk.unchanged and not walk.kept and walk.reshaped():
                # Every page answered 304, but fewer pages (or parents) than last time: the
                # missing ones held rows that are now deletes. Walk it all again, without
                # validators (a 304's Link header cannot be trusted to carry the rest).
                walk = _Walk({}, config.records_path, sink)
                for listing in self._listings(client, walk, own):
                    self._walk(client, walk, listing)
            if snapshot and walk.unchanged and walk.kept:
                changed, walk.documents = walk.documents, []
                for listing, paginator, page in walk.unchanged:
                    self._page(client, walk, listing, paginator, page, conditional=False)
                walk.documents += changed
                walk.unchanged = []
            requests = client.requests
        not_modified = bool(walk.unchanged) and not walk.kept
        return FetchResult(
            documents=walk.documents,
            records_path=config.records_path,
            record_count=0 if not_modified else walk.record_count if walk.counted else None,
            pages=walk.pages,
            requests=requests,
            complete=snapshot and not not_modified,
            validators=walk.validators,
            not_modified=not_modified,
            notes={"ignored": dict(walk.ignored)} if walk.ignored else {},
            streamed=walk.streamed,
        )

    def _listings(self, client: HttpClient, walk: _Walk, own: _Listing) -> list[_Listing]:
        """The listings to walk: the source's own, or one per distinct parent record."""
        parent = self.config.parent
        if parent is None:
            return [own]
        listing = _Listing(
            self.config.join(parent.path),
            dict(parent.params),
            parent.paginator,
            parent.records_path,
            parent=True,
        )

        def key(record: dict[str, Any]) -> bytes:
            # Parent records are told apart by the child walk they lead to.
            return _identity(self._child(own, record))

        children: dict[Any, _Listing] = {}
        for record in self._walk(client, walk, listing, key):
            with self._context():
                child = self._child(own, record)
            # A parent listed twice (it moved between pages) is walked once.
            children.setdefault(_identity(child), child)
        return list(children.values())

    def _child(self, own: _Listing, record: dict[str, Any]) -> _Listing:
        """The source's own listing for one parent ``record``: placeholders filled in."""
        assert self.config.parent is not None

        def value(path: str) -> Any:
            found = lookup(record, path)
            if found is MISSING or found is None:
                raise PayloadError(
                    f"a parent record has no {path!r} "
                    f"(keys: {', '.join(sorted(map(str, record))[:10])})"
                )
            return found

        def fill(template: str, escape: bool) -> str:
            def one(match: re.Match[str]) -> str:
                text = _text(value(match.group(1)))
                return quote(text, safe="") if escape else text

            return PLACEHOLDER.sub(one, template)

        params = {
            name: fill(v, escape=False) if isinstance(v, str) else v
            for name, v in own.params.items()
        }
        copied = {name: value(path) for name, path in self.config.parent.fields.items()}
        return replace(own, url=fill(own.url, escape=True), params=params, copied=copied)

    def _primary_key(self, record: dict[str, Any]) -> bytes:
        """A record's primary key (copied parent fields included), for offset overlap checks."""
        paths = (self.config.columns[k].path or k for k in self.config.primary_key)
        return orjson.dumps(
            [None if v is MISSING else v for v in (lookup(record, p) for p in paths)]
        )

    def _walk(
        self, client: HttpClient, walk: _Walk, listing: _Listing, key: RecordKey | None = None
    ) -> list[dict[str, Any]]:
        """Walk every page of ``listing`` into ``walk``; the parent listing's records.

        ``key`` tells records apart for offset overlap checks (default: the primary key).
        """
        config = self.config
        paginator = make_paginator(listing.paginator, key or self._primary_key)
        request: PageRequest | None = paginator.first(listing.url, listing.params)
        found: list[dict[str, Any]] = []
        pages = 0
        while request is not None:
            if pages >= config.page_limit:
                where = httpx.URL(listing.url)
                raise LimitExceeded(
                    f"source {config.name!r}: GET {where.host}{where.path}: more than "
                    f"page_limit={config.page_limit} pages in one listing; raise the source's "
                    "page_limit if it is really that long (a truncated listing is never synced)"
                )
            pages += 1
            walk.pages += 1
            # Once a snapshot page has changed, the rest are needed whole anyway.
            conditional = not (config.sync == "snapshot" and walk.kept)
            answer = self._page(client, walk, listing, paginator, request, conditional)
            if answer is None:
                break  # a response action ignored it: the listing ends here
            response, body, records = answer
            if response.status_code == 304:
                walk.unchanged.append((listing, paginator, request))
            if listing.parent:
                found += records
            with self._context(walk.pages):
                request = paginator.next(request, response, body, records)
        return found

    def _page(
        self,
        client: HttpClient,
        walk: _Walk,
        listing: _Listing,
        paginator: Paginator,
        request: PageRequest,
        conditional: bool,
    ) -> tuple[httpx.Response, Any, list[dict[str, Any]]] | None:
        """GET one page into ``walk``; its response, decoded body and records.

        Sends the page's stored validator when ``conditional``, and keeps the validator to
        remember. A 304 adds no document and gives no body (None) and no records. None: a
        response action ignored the response.
        """
        config = self.config
        if not _same_origin(request.url, config.base_url):
            # A pagination link (Link header, next URL in a body) names another host: the
            # source's credentials go only where its base_url points.
            raise FetchError(
                f"source {config.name!r}: the next page is on another host "
                f"({urlsplit(request.url).netloc}); refusing to send credentials there"
            )
        with self._context():
            headers, auth_params = credentials(config.auth)
        if walk.root is None:
            walk.root = request_key(request, auth_params)
        remember = paginator.conditional and not listing.parent
        key = request_key(request, auth_params) if remember else None
        validator = walk.stored.get(key) if key is not None and conditional else None
        if validator is not None and not validator.sendable:
            validator = None  # the page was walked, but gave nothing to send back
        try:
            response = client.get(
                request.url,
                params={**request.params, **auth_params},
                headers={**config.headers, **headers},
                validator=validator,
                credential=credential_id([*headers.values(), *auth_params.values()]),
                secrets=[*headers, *auth_params],
            )
        except FetchError as error:
            status = _status(error)
            if listing.parent or status not in self._ignore:
                raise
            walk.ignored[status] += 1
            return None
        if not listing.parent and response.status_code in self._ignore:
            walk.ignored[response.status_code] += 1
            return None
        not_modified = response.status_code == 304
        if not_modified and validator is None:
            raise FetchError(
                f"source {config.name!r}, page {walk.pages}: GET {response.url.path} answered "
                "304 Not Modified to a request without validators"
            )
        if key is not None:
            # Kept even without a validator: the walk's shape is compared next time.
            kept = validator_of(response, validator) or Validator()
            walk.validators[key] = replace(kept, walk=walk.root)
        if not_modified:
            return response, None, []
        body: Any = None
        records: list[dict[str, Any]] = []
        if paginator.reads_body or listing.parent or listing.copied:
            body = self._decode(response, walk.pages)
            records = self._records(body, walk.pages, listing.records_path)
        if listing.parent:
            return response, body, records
        if listing.copied:
            for record in records:
                record.update(listing.copied)
            walk.keep(orjson.dumps(body))
        else:
            # Keep the bytes, not decoded objects: normalization splits and types them in
            # one columnar pass (and 100k live dicts would cost more in GC than parsing).
            walk.keep(response.content)
        walk.record_count += len(records)
        walk.counted = walk.counted and body is not None
        return response, body, records

    @contextmanager
    def _context(self, page: int | None = None) -> Iterator[None]:
        # Name the source (and page) in errors raised by helpers that don't know them.
        try:
            yield
        except SourceError as exc:
            where = f"source {self.config.name!r}" + (f", page {page}" if page else "")
            raise type(exc)(f"{where}: {exc}") from exc

    def _decode(self, response: httpx.Response, page: int) -> Any:
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            kind = response.headers.get("content-type", "no content-type")
            raise PayloadError(
                f"source {self.config.name!r}, page {page}: GET {response.url.path} "
                f"did not return JSON ({kind})"
            ) from None

    def _records(self, body: Any, page: int, path: str | None) -> list[dict[str, Any]]:
        found = body if path is None else lookup(body, path)
        where = "the body" if path is None else f"records_path {path!r}"
        problem = None
        if found is MISSING:
            problem = f"{where} is missing"
        elif not isinstance(found, list):
            problem = f"{where} is {_kind(found)}, not a list of records"
        elif not all(isinstance(item, dict) for item in found):
            problem = f"{where} is a list holding non-objects"
        if problem is None:
            return found
        if isinstance(body, dict):
            # Top-level keys (never values) help pick the right records_path.
            problem += f" (top-level keys: {', '.join(sorted(map(str, body))[:10])})"
        raise PayloadError(f"source {self.config.name!r}, page {page}: {problem}")


def _identity(listing: _Listing) -> bytes:
    """What makes two child walks the same walk: URL, params and copied fields."""
    return orjson.dumps([listing.url, listing.params, listing.copied], option=orjson.OPT_SORT_KEYS)


def _text(value: Any) -> str:
    """A JSON value as it goes into a URL: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _same_origin(url: str, base_url: str) -> bool:
    """Whether ``url`` has the scheme, host and port of ``base_url``.

    >>> _same_origin("https://api.github.com/x?page=2", "https://api.github.com")
    True
    >>> _same_origin("https://evil.example/x", "https://api.github.com")
    False
    """
    a, b = urlsplit(url), urlsplit(base_url)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def _status(error: FetchError) -> int | None:
    """The HTTP status a ``FetchError`` reports, if any (never a rate limit's)."""
    return None if isinstance(error, RateLimited) else error.status


def _kind(value: Any) -> str:
    return {dict: "an object", str: "a string", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def build_rest_source(config: RestSourceConfig | Mapping[str, Any], **options: Any) -> RestSource:
    """A ``RestSource`` from a validated config or a raw mapping (validated here)."""
    if not isinstance(config, RestSourceConfig):
        config = RestSourceConfig.model_validate(config)
    return RestSource(config, **options)
