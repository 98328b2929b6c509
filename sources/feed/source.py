"""The feed source: one conditional GET of an RSS, Atom or JSON Feed, one record per entry."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx
from changewatch.sources.base import DocumentSink, FetchResult, Validator
from changewatch.sources.errors import LimitExceeded, PayloadError, SourceError
from changewatch.sources.feed.config import FeedSourceConfig
from changewatch.sources.feed.parse import FEED_ACCEPT, FeedFormatError, FeedTooLong, parse_feed
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.limits import Deadline
from changewatch.sources.rest.auth import credentials

__all__ = ["FeedSource", "build_feed_source"]

ClientFactory = Callable[..., HttpClient]


class FeedSource:
    """A ``Source`` reading one feed described by a ``FeedSourceConfig``.

    A feed shows only its latest N entries: an entry that scrolls off the end has not been
    deleted upstream. So every result has ``complete=False`` and a sync never infers deletes
    from a feed, whatever its ``sync`` mode; entries stay in the table once seen. The stored
    cursor is ignored: a feed cannot be asked for "changes since", and one request returns it
    all anyway.
    """

    def __init__(
        self,
        config: FeedSourceConfig,
        *,
        policy: HttpPolicy | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.config = config
        self.policy = (policy or HttpPolicy()).bounded_by(config)
        # Called as client_factory(policy=..., name=..., deadline=...); tests inject
        # sleep/clock this way.
        self.client_factory = client_factory or HttpClient

    def fetch(
        self,
        *,
        cursor: str | None,
        validators: Mapping[str, Validator] | None = None,
        sink: DocumentSink | None = None,
    ) -> FetchResult:
        """The feed's entries as records; ``FetchResult.not_modified`` on a 304.

        ``validators`` (keyed by the configured url) become ``If-None-Match`` /
        ``If-Modified-Since``; the response's ``ETag`` / ``Last-Modified`` come back in
        ``FetchResult.validators`` under the same key. Raises ``FetchError`` when the request
        fails and ``PayloadError`` when the response is not a feed.
        """
        config = self.config
        known = (validators or {}).get(config.url)
        with self._context():
            auth_headers, auth_params = credentials(config.auth)
        headers = {"Accept": FEED_ACCEPT, **config.headers, **auth_headers}
        if known is not None and known.etag:
            headers["If-None-Match"] = known.etag
        if known is not None and known.last_modified:
            headers["If-Modified-Since"] = known.last_modified
        deadline = Deadline.after(config.sync_timeout)
        with self.client_factory(policy=self.policy, name=config.name, deadline=deadline) as client:
            response = client.get(
                config.url,
                params=auth_params or None,
                headers=headers,
                secrets=[*auth_headers, *auth_params],
            )
            requests = client.requests
        remembered = _validators(config.url, response, known)
        if response.status_code == 304:
            return FetchResult(
                documents=[],
                pages=1,
                requests=requests,
                complete=False,
                validators=remembered,
                not_modified=True,
            )
        try:
            parsed = parse_feed(
                response.content,
                response.headers.get("content-type"),
                # The final URL (after redirects) without its query string, which may hold
                # a credential: relative links in the feed are relative to it.
                base_url=str(response.url.copy_with(query=None)),
                max_entries=config.max_entries,
            )
        except FeedTooLong as exc:
            raise LimitExceeded(
                f"source {config.name!r}: GET {response.url.host}{response.url.path}: {exc}; "
                "raise the source's max_entries if it really lists that many"
            ) from None
        except FeedFormatError as exc:
            raise PayloadError(
                f"source {config.name!r}: GET {response.url.host}{response.url.path} {exc}"
            ) from None
        result = FetchResult.from_records(
            parsed.records,
            pages=1,
            requests=requests,
            # Never a complete listing: see the class docstring.
            complete=False,
            validators=remembered,
            notes={"feed_version": parsed.version},
        )
        if sink is not None:
            sink(result.documents.pop(), result.records_path)
            result.streamed = 1
        return result

    @contextmanager
    def _context(self) -> Iterator[None]:
        # Name the source in errors raised by helpers that don't know it.
        try:
            yield
        except SourceError as exc:
            raise type(exc)(f"source {self.config.name!r}: {exc}") from exc


def _validators(
    url: str, response: httpx.Response, known: Validator | None
) -> dict[str, Validator]:
    """What to send back next time; a 304 may omit headers the stored validator still has."""
    etag = response.headers.get("etag")
    last_modified = response.headers.get("last-modified")
    if response.status_code == 304 and known is not None:
        etag = etag or known.etag
        last_modified = last_modified or known.last_modified
    if not (etag or last_modified):
        return {}
    return {url: Validator(etag=etag, last_modified=last_modified)}


def build_feed_source(config: FeedSourceConfig | Mapping[str, Any], **options: Any) -> FeedSource:
    """A ``FeedSource`` from a validated config or a raw mapping (validated here)."""
    if not isinstance(config, FeedSourceConfig):
        config = FeedSourceConfig.model_validate(config)
    return FeedSource(config, **options)
