"""The generic REST source: walks every page of a JSON endpoint into one list of records."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from sources.base import FetchResult, Validator
from sources.errors import FetchError, PayloadError, SourceError
from sources.http import HttpClient, HttpPolicy
from sources.rest.auth import credentials
from sources.rest.config import Incremental, RestSourceConfig
from sources.rest.paginators import MISSING, PageRequest, lookup, make_paginator

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
        """Every page's JSON (since ``cursor`` when incremental); raises on any failure."""
        config = self.config
        params: dict[str, Any] = dict(config.params)
        if config.sync == "incremental" and cursor and config.incremental is not None:
            with self._context():
                params[config.incremental.param] = cursor_param(cursor, config.incremental)
        paginator = make_paginator(config.paginator)
        request: PageRequest | None = paginator.first(config.url, params)
        documents: list[bytes] = []
        pages = 0
        record_count: int | None = 0 if paginator.reads_body else None
        with self.client_factory(policy=self.policy, name=config.name) as client:
            while request is not None:
                if config.page_limit is not None and pages >= config.page_limit:
                    raise FetchError(
                        f"source {config.name!r}: more than page_limit={config.page_limit} "
                        "pages; raise the limit rather than sync a truncated listing"
                    )
                with self._context():
                    headers, auth_params = credentials(config.auth)
                response = client.get(
                    request.url,
                    params={**request.params, **auth_params},
                    headers={**config.headers, **headers},
                )
                pages += 1
                body: Any = None
                page_records: list[dict[str, Any]] = []
                if paginator.reads_body:
                    body = self._decode(response, pages)
                    page_records = self._records(body, pages)
                    record_count = (record_count or 0) + len(page_records)
                # Keep the bytes, not decoded objects: normalization splits and types them in
                # one columnar pass (and 100k live dicts would cost more in GC than parsing).
                documents.append(response.content)
                with self._context(pages):
                    request = paginator.next(request, response, body, page_records)
            requests = client.requests
        return FetchResult(
            documents=documents,
            records_path=config.records_path,
            record_count=record_count,
            pages=pages,
            requests=requests,
            complete=config.sync == "snapshot",
        )

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
