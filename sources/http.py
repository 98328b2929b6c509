"""The one HTTP policy every connector uses: timeouts, retries, backoff and Retry-After."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from sources.errors import FetchError

# httpx logs every request's full URL at INFO, and a query string may carry an API key.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

log = logging.getLogger(__name__)

__all__ = ["HttpClient", "HttpPolicy"]


@dataclass(frozen=True)
class HttpPolicy:
    """Timeouts and retry rules shared by every connector (times in seconds)."""

    timeout: float = 30.0
    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 120.0
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


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta seconds or HTTP-date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


class HttpClient:
    """One pooled httpx client that applies an ``HttpPolicy`` to every GET.

    ``requests`` counts the attempts sent (retries included). Errors name the URL path only:
    query strings and headers may carry credentials.
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
    ) -> None:
        self.policy = policy or HttpPolicy()
        self.name = name
        self.requests = 0
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
    ) -> httpx.Response:
        """GET ``url`` with ``params`` merged into its query; return the 2xx/3xx response.

        Retries transport errors, 429 and 5xx; raises ``FetchError`` when they run out, on a
        Retry-After beyond ``max_retry_after``, and at once on any other 4xx.
        """
        target: str | httpx.URL = url
        if params:
            # httpx replaces a URL's query with `params`; merging keeps a next-page link intact.
            target = httpx.URL(url).copy_merge_params(dict(params))
        what = _Described(self, target)
        policy = self.policy
        attempt = 0
        while True:
            attempt += 1
            self.requests += 1
            try:
                response = self._client.get(target, headers=headers)
            except httpx.TransportError as exc:
                problem, wait = type(exc).__name__, None
                if attempt > policy.max_retries:
                    raise FetchError(f"{what} failed after {attempt} attempts: {problem}") from exc
            else:
                status = response.status_code
                if status < 400:
                    return response
                problem = f"HTTP {status} {response.reason_phrase}".rstrip()
                if not _retryable(status):
                    raise FetchError(f"{what} gave {problem}{_hint(status)}")
                if attempt > policy.max_retries:
                    raise FetchError(f"{what} failed after {attempt} attempts: last {problem}")
                wait = retry_after_seconds(response.headers.get("Retry-After"), self._now())
                if wait is not None and wait > policy.max_retry_after:
                    raise FetchError(
                        f"{what} gave {problem} with Retry-After {wait:.0f}s, more than the "
                        f"{policy.max_retry_after:.0f}s limit: deferred to a later sync"
                    )
            if wait is None:
                wait = policy.backoff(attempt, self._rng)
            log.warning(
                "%s: %s; retry %d of %d in %.1fs",
                what,
                problem,
                attempt,
                policy.max_retries,
                wait,
            )
            self._sleep(wait)

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
