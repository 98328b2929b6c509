"""Rate budgets per host and credential, learnt from response headers, shared process-wide.

A budget is spent until a time T when a server said so: ``x-ratelimit-remaining: 0`` with
``x-ratelimit-reset`` (GitHub, epoch seconds), ``ratelimit-remaining: 0`` with
``ratelimit-reset`` (IETF draft, delta seconds), or ``Retry-After`` (seconds or an HTTP date)
on an error. A 403/429 that mentions a rate limit but carries none of these is a *secondary*
limit (GitHub): blocked for ``secondary_wait`` seconds, doubled on each repeat until a request
succeeds. ``HttpClient`` asks ``admit`` before every request and waits or defers.

Credentials are identified by a short hash: no secret is kept here or shown in a message.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

__all__ = ["Budget", "RATE_LIMITS", "RateLimits", "credential_id", "retry_after_seconds"]

# Headers and query parameters that usually carry a credential (their values are hashed).
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "private-token", "cookie"}
)
CREDENTIAL_PARAMS = frozenset(
    {"api_key", "apikey", "key", "token", "access_token", "auth_token", "client_secret"}
)


def credential_id(values: Iterable[str]) -> str:
    """A short, stable hash naming a credential (``""`` when there is none)."""
    joined = "\0".join(sorted(v for v in values if v))
    return hashlib.sha256(joined.encode()).hexdigest()[:12] if joined else ""


def guess_credential(headers: Mapping[str, str], params: Mapping[str, object]) -> str:
    """``credential_id`` of the values of credential-like headers and query parameters."""
    values = [str(v) for k, v in headers.items() if k.lower() in CREDENTIAL_HEADERS]
    values += [str(v) for k, v in params.items() if str(k).lower() in CREDENTIAL_PARAMS]
    return credential_id(values)


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


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _primary(headers: httpx.Headers, now: float) -> tuple[int | None, float | None]:
    """``(remaining, reset at epoch seconds)`` from GitHub-style or IETF-draft headers."""
    remaining = _number(headers.get("x-ratelimit-remaining"))
    if remaining is not None:
        return int(remaining), _number(headers.get("x-ratelimit-reset"))
    remaining = _number(headers.get("ratelimit-remaining"))
    if remaining is not None:
        delta = _number(headers.get("ratelimit-reset"))
        return int(remaining), None if delta is None else now + delta
    return None, None


@dataclass
class Budget:
    """What is known of one host+credential budget (a snapshot when read from outside)."""

    remaining: int | None = None  # None: unknown (never told, or the window reset)
    reset_at: float | None = None
    blocked_until: float = 0.0
    strikes: int = 0  # secondary-limit hits in a row


class RateLimits:
    """Budgets keyed ``(host, credential)`` and per-host in-flight gates; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._budgets: dict[tuple[str, str], Budget] = {}
        self._gates: dict[str, threading.BoundedSemaphore] = {}

    def budget(self, key: tuple[str, str]) -> Budget:
        """A copy of what is known of ``key``'s budget."""
        with self._lock:
            found = self._budgets.get(key)
            return Budget(**vars(found)) if found else Budget()

    def gate(self, host: str, limit: int) -> threading.BoundedSemaphore:
        """The semaphore bounding requests in flight to ``host`` (the first ``limit`` wins)."""
        with self._lock:
            if host not in self._gates:
                self._gates[host] = threading.BoundedSemaphore(limit)
            return self._gates[host]

    def admit(self, key: tuple[str, str], now: float) -> float | None:
        """None, with one request counted against the budget, or the time to wait until."""
        with self._lock:
            budget = self._budgets.setdefault(key, Budget())
            if budget.blocked_until > now:
                return budget.blocked_until
            if budget.reset_at is not None and now >= budget.reset_at:
                budget.remaining = budget.reset_at = None  # a new window: unknown again
            if budget.remaining is not None:
                if budget.remaining <= 0 and budget.reset_at is not None:
                    return budget.reset_at
                budget.remaining -= 1
            return None

    def record(
        self, key: tuple[str, str], response: httpx.Response, now: float, secondary_wait: float
    ) -> float | None:
        """Learn from ``response``; for a rate-limited one, the time a retry may be sent."""
        status, headers = response.status_code, response.headers
        remaining, reset_at = _primary(headers, now)
        retry_after = None
        if status in (403, 429) or status >= 500:
            retry_after = retry_after_seconds(headers.get("retry-after"), now)
        secondary = (
            status in (403, 429)
            and retry_after is None
            and not (remaining == 0 and reset_at is not None)
            and "rate limit" in response.text.lower()
        )
        with self._lock:
            budget = self._budgets.setdefault(key, Budget())
            if remaining is not None:
                budget.remaining, budget.reset_at = remaining, reset_at
            elif status == 304 and budget.remaining is not None:
                budget.remaining += 1  # conditional 304s are free: give back what admit took
            if status < 400:
                budget.strikes = 0
            until = None
            if retry_after is not None:
                until = now + retry_after
            elif status in (403, 429) and remaining == 0 and reset_at is not None:
                until = reset_at
            elif secondary:
                budget.strikes += 1
                until = now + secondary_wait * 2 ** (budget.strikes - 1)
            if until is not None:
                budget.blocked_until = max(budget.blocked_until, until)
            return until


# The one registry of the process: every HttpClient shares it unless given its own (tests).
RATE_LIMITS = RateLimits()
