"""The one HTTP policy every connector uses: timeouts, retries, backoff, rate budgets,
conditional requests, redirects and the bounds of ``sources.limits``.

Before each request the client asks the process-wide ``RateLimits`` (``sources.ratelimit``)
whether the budget of the URL's host and the request's credential is spent: it waits when the
budget comes back within ``max_wait`` seconds, else raises ``RateLimited`` so the sync is
deferred to a later tick. At most ``max_in_flight`` requests per host are in flight at once.

Every body is streamed and read through ``read_body`` (size cap, response and sync deadlines).
Redirects are followed here, not by httpx, so credentials never leave their origin and a
redirect never leads to a non-HTTP URL or into a private network the source is not in (see
``sources.redirects``); no cookie is ever kept.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx
from changewatch.sources.base import SourceBase, Validator
from changewatch.sources.errors import FetchError, LimitExceeded, RateLimited
from changewatch.sources.inflate import ACCEPT_ENCODING
from changewatch.sources.limits import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_RESPONSE_TIMEOUT,
    Deadline,
    read_body,
    too_slow,
)
from changewatch.sources.ratelimit import (
    RATE_LIMITS,
    RateLimits,
    guess_credential,
    retry_after_seconds,
)
from changewatch.sources.redirects import Resolver, redirect, refusal, resolve

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
    # Bounds of one response (see sources.limits; sources set them from their config).
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    response_timeout: float = DEFAULT_RESPONSE_TIMEOUT
    # Redirects one request may follow (httpx's default is 20; APIs need one or two).
    max_redirects: int = 10
    # Follow a redirect into a loopback, link-local or private network the first URL is not
    # in (refused by default: see sources.redirects).
    allow_private_redirects: bool = False

    def httpx_timeout(self, left: float | None = None) -> httpx.Timeout:
        """The httpx timeout: ``timeout`` per read, connecting within 10 s at most, neither
        longer than the response may take nor than ``left`` (seconds left to the sync)."""
        limit = min(self.timeout, self.response_timeout)
        if left is not None:
            limit = max(0.001, min(limit, left))
        return httpx.Timeout(limit, connect=min(10.0, limit))

    def bounded_by(self, source: SourceBase) -> HttpPolicy:
        """This policy with the bounds of one response that ``source``'s config sets.

        A bound the config leaves out keeps this policy's value (the same default, unless
        code chose another).
        """
        bounds = ("max_response_bytes", "response_timeout", "allow_private_redirects")
        return replace(
            self,
            **{name: getattr(source, name) for name in bounds if name in source.model_fields_set},
        )

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


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings (certifi's CAs, or $SSL_CERT_FILE / $SSL_CERT_DIR), built
    once per process: loading the CA bundle takes 20 ms of CPU, which every client paid, and a
    sync run makes a client per source. httpx already shares one context among all of a
    client's connections; the CA settings are read once per process."""
    return httpx.create_ssl_context()


def _new_client(policy: HttpPolicy, transport: httpx.BaseTransport | None) -> httpx.Client:
    """An httpx client with the settings every request of ``HttpClient`` relies on. The
    timeout is set per request (``HttpClient._send``); the rest holds for any policy of the
    same user agent."""
    return httpx.Client(
        timeout=policy.httpx_timeout(),
        headers={
            "User-Agent": policy.user_agent,
            "Accept": "application/json",
            # Only what sources.inflate inflates in bounded steps.
            "Accept-Encoding": ACCEPT_ENCODING,
        },
        # Followed in `get`: httpx would send custom auth headers to any other origin.
        follow_redirects=False,
        # No cookies: one set by an API would go to every port of its host (or, the client
        # being shared, to another source's requests).
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
        transport=transport,
        verify=tls_context(),
    )


# The process's httpx clients, one per user agent, shared by every HttpClient made without a
# transport (thread-safe: a batched run's syncs use one at once). A client per sync cost some
# 3 ms of CPU (reading the proxy settings of the environment, a new pool) and a new TCP (and
# TLS) connection per sync; shared, a source's host keeps its connection open between syncs.
# Nothing of one sync reaches another through it: no cookie is ever kept, credentials go as
# each request's own headers, and redirects, addresses and size limits are checked per
# request, as before. The proxy settings of the environment are read once per process.
_shared: dict[str, httpx.Client] = {}
_shared_lock = threading.Lock()


def _shared_client(policy: HttpPolicy) -> httpx.Client:
    with _shared_lock:
        client = _shared.get(policy.user_agent)
        if client is None:
            client = _shared[policy.user_agent] = _new_client(policy, None)
        return client


# A forked child must not share its parent's sockets: it starts with no shared client.
os.register_at_fork(after_in_child=_shared.clear)


class HttpClient:
    """One pooled httpx client that applies an ``HttpPolicy`` to every GET.

    ``requests`` counts the attempts sent (retries included). Errors name the URL path only:
    query strings and headers may carry credentials. ``now``/``sleep`` are injectable so tests
    run on a controlled clock; ``limits`` defaults to the process-wide registry. ``deadline``
    bounds every request of the client (a sync's walk), in real time. ``resolver`` gives a
    redirect target's addresses for the private-network check (tests map names with it).
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
        deadline: Deadline | None = None,
        resolver: Resolver = resolve,
    ) -> None:
        self.policy = policy or HttpPolicy()
        self._resolver = resolver
        self.name = name
        self.deadline = deadline
        self.requests = 0
        self.limits = limits or RATE_LIMITS
        self._sleep = sleep
        self._now = now
        self._rng = rng or random.Random()
        # A given transport (tests) gets a client of its own; otherwise the process's shared
        # one for this user agent, whose pool keeps connections open from one sync to the next.
        self._own = transport is not None
        self._client = (
            _new_client(self.policy, transport) if self._own else _shared_client(self.policy)
        )

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool, if this client's own (the shared one stays open)."""
        if self._own:
            self._client.close()

    def get(
        self,
        url: str | httpx.URL,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        validator: Validator | None = None,
        credential: str | None = None,
        secrets: Collection[str] = (),
    ) -> httpx.Response:
        """GET ``url`` with ``params`` merged into its query; return the 2xx/3xx response.

        With a ``validator`` the request is conditional, and a 304 is returned like any
        response. ``credential`` names the budget the request spends (see
        ``changewatch.sources.ratelimit.credential_id``); by default it is derived from
        credential-like headers and parameters. ``secrets`` name the headers and parameters
        that carry credentials: a redirect to another origin drops them (and any other
        credential-like one; see ``changewatch.sources.redirects``), at most ``max_redirects``
        are followed. Retries transport errors, 429 and 5xx, and waits out rate limits up to
        ``max_wait``; raises ``RateLimited`` for longer ones, ``FetchError`` when retries run
        out and at once on any other 4xx, ``LimitExceeded`` when the response or the
        client's deadline passes a limit of ``changewatch.sources.limits``.
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
        crossed, start = False, target
        for _ in range(self.policy.max_redirects + 1):
            response = self._exchange(target, sent, credential)
            if not response.has_redirect_location:
                return response
            try:
                refused = refusal(
                    target.join(response.headers["location"]),
                    start,
                    resolver=self._resolver,
                    allow_private=self.policy.allow_private_redirects,
                )
                hop = None if refused else redirect(response, sent, secrets, crossed=crossed)
            except httpx.InvalidURL as exc:
                refused, hop = f"redirect to an invalid URL refused ({exc})", None
            if hop is None:
                # Not retried: the same answer would send it to the same place.
                raise FetchError(f"{_Described(self, target)}: {refused}")
            target, sent, crossed = hop.url, hop.headers, hop.crossed
            if crossed:
                credential = ""  # nothing of the source's credential goes along
        raise FetchError(
            f"{_Described(self, url)}: more than max_redirects={self.policy.max_redirects} "
            f"redirects (the last to {target.host}{target.path})"
        )

    def _exchange(self, target: httpx.URL, sent: dict[str, str], credential: str) -> httpx.Response:
        """One request, retried by the policy; the response, its body read (any 3xx too)."""
        key = (_host(target), credential)
        gate = self.limits.gate(key[0], self.policy.max_in_flight)
        what = _Described(self, target)
        policy = self.policy
        attempt = 0
        while True:
            attempt += 1
            self._wait_for_budget(key, what)
            if self.deadline is not None:
                self.deadline.check(what)
            self.requests += 1
            try:
                with gate:
                    response = self._send(target, sent, what)
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
            if self.deadline is not None and wait >= self.deadline.left():
                # The retry would start past the deadline: say so now, and why it retried.
                raise LimitExceeded(f"{self.deadline.message(what)} (retrying after {problem})")
            log.warning(
                "%s: %s; retry %d of %d in %.1fs", what, problem, attempt, policy.max_retries, wait
            )
            self._sleep(wait)

    def _send(self, target: httpx.URL, sent: dict[str, str], what: _Described) -> httpx.Response:
        """Send one GET and read its body within the size cap and both deadlines."""
        started = time.monotonic()
        left = self.deadline.left() if self.deadline is not None else None
        request = self._client.build_request(
            "GET", target, headers=sent, timeout=self.policy.httpx_timeout(left)
        )
        try:
            response = self._client.send(request, stream=True)
            read_body(
                response,
                what,
                max_bytes=self.policy.max_response_bytes,
                timeout=self.policy.response_timeout,
                started=started,
                deadline=self.deadline,
            )
        except httpx.TimeoutException:
            # The read timeout is cut to what the deadlines leave: name the one that ran out.
            if self.deadline is not None and self.deadline.left() <= 0:
                raise LimitExceeded(self.deadline.message(what)) from None
            if time.monotonic() - started >= self.policy.response_timeout:
                raise too_slow(what, self.policy.response_timeout) from None
            raise
        return response

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
            if self.deadline is not None and delay >= self.deadline.left():
                raise RateLimited(
                    f"{what}: rate limited for this host and credential until {_utc(until)} "
                    f"({delay:.0f}s, past the sync's {self.deadline.setting}): deferred to a "
                    "later sync",
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
