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

__all__ = ["max_attempts", "next_attempt", "wait"]


def max_attempts(config: RetryConfig) -> int:
    """Attempts a notification gets: one, then one after each delay.

    >>> max_attempts(RetryConfig())
    12
    """
    return len(config.delays) + 1


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
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> datetime | None:
    """When to try again after ``failures`` failed attempts; None once they are all spent."""
    if failures >= max_attempts(config):
        return None
    return now + timedelta(seconds=wait(config, failures, retry_after=retry_after, rng=rng))
