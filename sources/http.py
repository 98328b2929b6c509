"""The one HTTP policy every connector uses: timeouts, retries, backoff, rate budgets and
conditional requests.

Before each request the client asks the process-wide ``RateLimits`` (``sources.ratelimit``)
whether the budget of the URL's host and the request's credential is spent: it waits when the
budget comes back within ``max_wait`` seconds, else raises ``RateLimited`` so the sync is
deferred to a later tick. At most ``max_in_flight`` requests per host are in flight at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from changewatch.sources.base import Validator
from changewatch.sources.errors import FetchError, RateLimited
from changewatch.sources.ratelimit import (
    RATE_LIMITS,
    RateLimits,
    guess_credential,
    retry_after_seconds,
)

# httpx logs every request's full URL at INFO, and a query string may carry an API key.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

log = logging.getLogger(__name__)

__all__ = ["HttpClient", "HttpPolicy", "retry_after_seconds", "validator_of"]


@dataclass(frozen=True)
class HttpPolicy:
    """Timeouts, retry and politeness rules shared by every connector (times in seconds)."""

    timeout: float = 30.0
    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    # Longest wait for a rate limit (Retry-After, a spent budget, a secondary limit); a longer
    # one raises RateLimited instead, and the sync is deferred.
    max_wait: float = 60.0
    # First wait after a secondary rate limit without headers; doubled on each repeat.
    secondary_wait: float = 60.0
    # Requests in flight to one host across the process (the first client's value wins).
    max_in_flight: int = 4
    user_agent: str = "changewatch/0.1"

    def httpx_timeout(self) -> httpx.Timeout:
        """The httpx timeout: ``timeout`` overall, connecting within 10 s at most."""
        return httpx.Timeout(self.timeout, connect=min(10.0, self.timeout))

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...).

        Exponential, capped at ``backoff_max``, with "equal jitter": a random point in the
        upper half of the window, so clients retrying together spread out yet still back off.
        """
        window = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return window / 2 + rng.uniform(0, window / 2)


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def validator_of(response: httpx.Response, sent: Validator | None = None) -> Validator | None:
    """The ``ETag`` / ``Last-Modified`` to send back next time, from ``response``.

    A 304 may repeat only some of them: the rest are kept from ``sent``, the validator that
    earned it.
    """
    etag, modified = response.headers.get("etag"), response.headers.get("last-modified")
    if response.status_code == 304 and sent is not None:
        etag, modified = etag or sent.etag, modified or sent.last_modified
    return Validator(etag=etag, last_modified=modified) if etag or modified else None


def _host(url: httpx.URL) -> str:
    return f"{url.host}:{url.port}" if url.port else url.host


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class HttpClient:
    """One pooled httpx client that applies an ``HttpPolicy`` to every GET.

    ``requests`` counts the attempts sent (retries included). Errors name the URL path only:
    query strings and headers may carry credentials. ``now``/``sleep`` are injectable so tests
    run on a controlled clock; ``limits`` defaults to the process-wide registry.
    """

    def __init__(
        self,
        *,
        policy: HttpPolicy | None = None,
        name: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
        limits: RateLimits | None = None,
    ) -> None:
        self.policy = policy or HttpPolicy()
        self.name = name
        self.requests = 0
        self.limits = limits or RATE_LIMITS
        self._sleep = sleep
        self._now = now
        self._rng = rng or random.Random()
        self._client = httpx.Client(
            timeout=self.policy.httpx_timeout(),
            headers={"User-Agent": self.policy.user_agent, "Accept": "application/json"},
            # httpx drops Authorization when a redirect leaves the origin.
            follow_redirects=True,
            transport=transport,
        )

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def get(
        self,
        url: str | httpx.URL,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        validator: Validator | None = None,
        credential: str | None = None,
    ) -> httpx.Response:
        """GET ``url`` with ``params`` merged into its query; return the 2xx/3xx response.

        With a ``validator`` the request is conditional, and a 304 is returned like any
        response. ``credential`` names the budget the request spends (see
        ``changewatch.sources.ratelimit.credential_id``); by default it is derived from
        credential-like headers and parameters. Retries transport errors, 429 and 5xx, and waits
        out rate
        limits up to ``max_wait``; raises ``RateLimited`` for longer ones, ``FetchError`` when
        retries run out and at once on any other 4xx.
        """
        target = httpx.URL(url)
        if params:
            # httpx replaces a URL's query with `params`; merging keeps a next-page link intact.
            target = target.copy_merge_params(dict(params))
        sent = dict(headers or {})
        if validator is not None and validator.etag:
            sent["If-None-Match"] = validator.etag
        if validator is not None and validator.last_modified:
            sent["If-Modified-Since"] = validator.last_modified
        if credential is None:
            credential = guess_credential(sent, dict(target.params))
        key = (_host(target), credential)
        gate = self.limits.gate(key[0], self.policy.max_in_flight)
        what = _Described(self, target)
        policy = self.policy
        attempt = 0
        while True:
            attempt += 1
            self._wait_for_budget(key, what)
            self.requests += 1
            try:
                with gate:
                    response = self._client.get(target, headers=sent)
            except httpx.TransportError as exc:
                problem = type(exc).__name__
                if attempt > policy.max_retries:
                    # Host and port: "which server is down" is the first question.
                    port = target.port or (443 if target.scheme == "https" else 80)
                    reason = f"{problem}: {exc}" if str(exc) else problem
                    raise FetchError(
                        f"{what} failed after {attempt} attempts: cannot reach "
                        f"{target.host}:{port} ({reason})"
                    ) from exc
            else:
                status = response.status_code
                until = self.limits.record(key, response, self._now(), policy.secondary_wait)
                if status < 400:
                    return response
                problem = f"HTTP {status} {response.reason_phrase}".rstrip()
                if until is not None:
                    if attempt > policy.max_retries:
                        raise RateLimited(
                            f"{what} gave {problem} (rate limited until {_utc(until)}) after "
                            f"{attempt} attempts: deferred to a later sync",
                            retry_at=until,
                        )
                    log.warning("%s: %s, rate limited until %s", what, problem, _utc(until))
                    continue  # _wait_for_budget waits (or defers) before the retry
                if not _retryable(status):
                    raise FetchError(f"{what} gave {problem}{_hint(status)}", status=status)
                if attempt > policy.max_retries:
                    raise FetchError(
                        f"{what} failed after {attempt} attempts: last {problem}", status=status
                    )
            wait = policy.backoff(attempt, self._rng)
            log.warning(
                "%s: %s; retry %d of %d in %.1fs", what, problem, attempt, policy.max_retries, wait
            )
            self._sleep(wait)

    def _wait_for_budget(self, key: tuple[str, str], what: _Described) -> None:
        """Return once the budget of ``key`` allows a request, or raise ``RateLimited``."""
        now = self._now()
        while (until := self.limits.admit(key, now)) is not None:
            delay = until - now
            if delay > self.policy.max_wait:
                raise RateLimited(
                    f"{what}: rate limited for this host and credential until {_utc(until)} "
                    f"({delay:.0f}s, more than the {self.policy.max_wait:.0f}s limit): "
                    "deferred to a later sync",
                    retry_at=until,
                )
            log.info("%s: rate limited; waiting %.1fs", what, delay)
            self._sleep(delay)
            # Having slept until then, it is at least then (even if the clock is a stub).
            now = max(self._now(), until)

    def _describe(self, url: str | httpx.URL) -> str:
        # Path only: the query string may hold an API key.
        url = httpx.URL(url)
        label = f"{self.name}: " if self.name else ""
        return f"{label}GET {url.host}{url.path}"


class _Described:
    """A request's description for messages, built only if a message needs it."""

    def __init__(self, client: HttpClient, url: str | httpx.URL) -> None:
        self.client, self.url = client, url

    def __str__(self) -> str:
        return self.client._describe(self.url)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _hint(status: int) -> str:
    if status in (401, 403):
        return " (check the source's credentials and their permissions)"
    if status == 404:
        return " (check base_url and path)"
    return ""
