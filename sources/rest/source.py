"""The generic REST source: walks every page of a JSON endpoint into one list of records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from sources.base import FetchResult, Validator
from sources.errors import FetchError, PayloadError, SourceError
from sources.http import HttpClient, HttpPolicy, validator_of
from sources.ratelimit import credential_id
from sources.rest.auth import credentials
from sources.rest.config import Incremental, RestSourceConfig
from sources.rest.paginators import MISSING, PageRequest, Paginator, lookup, make_paginator

ClientFactory = Callable[..., HttpClient]


def cursor_param(cursor: str, incremental: Incremental) -> str | int:
    """The stored ISO-8601 ``cursor`` as the API wants it: unchanged, or unix seconds."""
    if incremental.format == "iso":
        return cursor
    try:
        moment = datetime.fromisoformat(cursor)
    except ValueError:
        raise SourceError(f"stored cursor {cursor!r} is not an ISO-8601 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # cursors are stored in UTC
    return int(moment.timestamp())


def request_key(request: PageRequest, secret_params: Iterable[str] = ()) -> str:
    """The key a page's validator is stored under: its URL, without credentials."""
    url = httpx.URL(request.url)
    if request.params:
        url = url.copy_merge_params(request.params)
    for name in secret_params:
        url = url.copy_remove_param(name)
    return str(url.copy_with(userinfo=b""))


@dataclass
class _Walk:
    """What one fetch has gathered so far."""

    paginator: Paginator
    stored: Mapping[str, Validator]  # validators from the last sync, by request key
    documents: list[bytes] = field(default_factory=list)
    validators: dict[str, Validator] = field(default_factory=dict)
    pages: int = 0
    record_count: int | None = None

    def __post_init__(self) -> None:
        if self.paginator.reads_body:
            self.record_count = 0


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
        self.policy = policy or HttpPolicy()
        # Called as client_factory(policy=..., name=...); tests inject sleep/clock this way.
        self.client_factory = client_factory or HttpClient

    def fetch(
        self, *, cursor: str | None, validators: Mapping[str, Validator] | None = None
    ) -> FetchResult:
        """Every page's JSON (since ``cursor`` when incremental); raises on any failure.

        With a paginator that can walk past a 304 (``conditional``: link_header, none) each
        page is requested with its stored validator, and a 304 page yields no document. All
        pages 304: ``not_modified=True``, no documents. Some 304: an incremental walk returns
        the changed pages only (the other pages' rows are stored already). A snapshot walk
        then no longer holds the full listing, and without it deletes go unseen (now, and
        forever if the next sync is all 304); so once a page has changed it asks the rest
        unconditionally and fetches the 304 pages again, returning ``complete=True``.
        """
        config = self.config
        params: dict[str, Any] = dict(config.params)
        if config.sync == "incremental" and cursor and config.incremental is not None:
            with self._context():
                params[config.incremental.param] = cursor_param(cursor, config.incremental)
        paginator = make_paginator(config.paginator)
        snapshot = config.sync == "snapshot"
        stored: Mapping[str, Validator] = (validators or {}) if paginator.conditional else {}
        walk = _Walk(paginator, stored)
        request: PageRequest | None = paginator.first(config.url, params)
        unchanged: list[PageRequest] = []  # pages answered 304
        with self.client_factory(policy=self.policy, name=config.name) as client:
            while request is not None:
                if config.page_limit is not None and walk.pages >= config.page_limit:
                    raise FetchError(
                        f"source {config.name!r}: more than page_limit={config.page_limit} "
                        "pages; raise the limit rather than sync a truncated listing"
                    )
                walk.pages += 1
                # Once a snapshot page has changed, the rest are needed whole anyway.
                conditional = not (snapshot and walk.documents)
                response, body, records = self._page(client, walk, request, conditional)
                if response.status_code == 304:
                    unchanged.append(request)
                with self._context(walk.pages):
                    request = paginator.next(request, response, body, records)
            if snapshot and unchanged and walk.documents:
                changed, walk.documents = walk.documents, []
                for page in unchanged:
                    self._page(client, walk, page, conditional=False)
                walk.documents += changed
                unchanged = []
            requests = client.requests
        not_modified = bool(unchanged) and not walk.documents
        return FetchResult(
            documents=walk.documents,
            records_path=config.records_path,
            record_count=0 if not_modified else walk.record_count,
            pages=walk.pages,
            requests=requests,
            complete=snapshot and not not_modified,
            validators=walk.validators,
            not_modified=not_modified,
        )

    def _page(
        self, client: HttpClient, walk: _Walk, request: PageRequest, conditional: bool
    ) -> tuple[httpx.Response, Any, list[dict[str, Any]]]:
        """GET one page into ``walk``; its response, decoded body and records.

        Sends the page's stored validator when ``conditional``, and keeps the validator to
        remember. A 304 adds no document and gives no body (None) and no records.
        """
        config = self.config
        with self._context():
            headers, auth_params = credentials(config.auth)
        key = request_key(request, auth_params) if walk.paginator.conditional else None
        validator = walk.stored.get(key) if key is not None and conditional else None
        response = client.get(
            request.url,
            params={**request.params, **auth_params},
            headers={**config.headers, **headers},
            validator=validator,
            credential=credential_id([*headers.values(), *auth_params.values()]),
        )
        not_modified = response.status_code == 304
        if not_modified and validator is None:
            raise FetchError(
                f"source {config.name!r}, page {walk.pages}: GET {response.url.path} answered "
                "304 Not Modified to a request without validators"
            )
        if key is not None:
            kept = validator_of(response, validator)
            if kept is not None:
                walk.validators[key] = kept
        if not_modified:
            return response, None, []
        body: Any = None
        records: list[dict[str, Any]] = []
        if walk.paginator.reads_body:
            body = self._decode(response, walk.pages)
            records = self._records(body, walk.pages)
            walk.record_count = (walk.record_count or 0) + len(records)
        # Keep the bytes, not decoded objects: normalization splits and types them in one
        # columnar pass (and 100k live dicts would cost more in GC than parsing).
        walk.documents.append(response.content)
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

    def _records(self, body: Any, page: int) -> list[dict[str, Any]]:
        path = self.config.records_path
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


def _kind(value: Any) -> str:
    return {dict: "an object", str: "a string", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def build_rest_source(config: RestSourceConfig | Mapping[str, Any], **options: Any) -> RestSource:
    """A ``RestSource`` from a validated config or a raw mapping (validated here)."""
    if not isinstance(config, RestSourceConfig):
        config = RestSourceConfig.model_validate(config)
    return RestSource(config, **options)
