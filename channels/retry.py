"""When a failed send is tried again: the retry schedule of a channel (``RetryConfig``).

Sits between a channel's send, which raises ``DeliveryError`` (``retryable`` says temporary or
permanent), and the outbox's record of the outcome (``outbox._settle``): a temporary failure
gets its next attempt's time, stored in ``deliveries.next_attempt_at`` (database state: no
worker sleeps through a wait), and the failure after the schedule's last delay dead-letters it.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from changewatch.channels.config import RetryConfig

__all__ = ["max_attempts", "next_attempt", "span", "wait"]


def max_attempts(config: RetryConfig) -> int:
    """Attempts a notification gets: one, then one after each delay.

    >>> max_attempts(RetryConfig())
    12
    """
    return len(config.delays) + 1


def span(config: RetryConfig) -> float:
    """Seconds the schedule keeps a notification trying, at the least (jitter may shorten
    each wait by its fraction).

    >>> round(span(RetryConfig(jitter=0)) / 3600, 1)
    67.6
    """
    return sum(config.delays) * config.scale * (1 - config.jitter)


def wait(
    config: RetryConfig,
    failures: int,
    *,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after the ``failures``-th failure (a probe's too; past the last delay,
    the last one again). The receiver's ``Retry-After`` replaces the schedule's wait.

    >>> exact = RetryConfig(jitter=0)
    >>> [wait(exact, n) for n in (1, 2, 3, 40)]
    [5.0, 300.0, 1800.0, 36000.0]
    >>> wait(exact, 1, retry_after=120), wait(exact, 1, retry_after=10**9)
    (120.0, 86400.0)
    """
    if retry_after is not None:
        # The receiver knows when it can take more: neither sooner nor jittered.
        return min(max(retry_after, 0.0), config.max_retry_after) * config.scale
    delay = config.delays[min(failures, len(config.delays)) - 1]
    spread = config.jitter * (2 * (rng or random).random() - 1)
    return delay * (1 + spread) * config.scale


def next_attempt(
    config: RetryConfig,
    failures: int,
    now: datetime,
    *,
    first: datetime | None = None,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> datetime | None:
    """When to try again after ``failures`` failed attempts; None once the schedule is spent.

    Spent means both: every attempt made, and (given ``first``, when the notification was
    queued) the schedule's whole span gone by. Attempts alone would be burnt early by a
    channel that reopens after a pause (its waiting retries all go at once) or by short
    Retry-After answers; past the last delay, attempts wait the last delay each.

    >>> exact = RetryConfig(delays=[60, 60], jitter=0)
    >>> t0 = datetime(2030, 1, 1)
    >>> next_attempt(exact, 3, t0 + timedelta(seconds=120), first=t0) is None
    True
    >>> next_attempt(exact, 3, t0 + timedelta(seconds=30), first=t0)
    datetime.datetime(2030, 1, 1, 0, 1, 30)
    """
    spent = first is None or (now - first).total_seconds() >= span(config)
    if failures >= max_attempts(config) and spent:
        return None
    return now + timedelta(seconds=wait(config, failures, retry_after=retry_after, rng=rng))
