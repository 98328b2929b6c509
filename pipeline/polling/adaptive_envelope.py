"""The adaptive polling envelope: when to probe a source next, from what its last probe saw.

Pure (no Dagster, no I/O): a source's state, one observation (changed, unchanged, or failed
with perhaps a ``Retry-After``) and the clock in; the next state out, holding the next due
time and the reason for it. The sync sensor (pipeline/polling/probe_decisions.py) keeps the state in
its cursor, so the schedule survives restarts of every process and never falls back to its start.

The rules, all bounded by ``[min_interval, max_interval]``:

* a change divides the interval by ``TIGHTEN`` (changes come in bursts: look again soon);
* from the ``GROW_AFTER``-th unchanged probe in a row, each multiplies it by ``GROW``;
* a failed probe leaves the interval alone and waits ``interval * 2**failures`` (at most
  ``max_interval``), and never less than the server's ``Retry-After``, which may exceed
  ``max_interval`` (the server said when; asking sooner only earns another 429).

Nothing here ever schedules a probe sooner than ``min_interval`` after the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "GROW",
    "GROW_AFTER",
    "TIGHTEN",
    "Bounds",
    "Observation",
    "PollState",
    "first_state",
    "observe",
    "spoken",
]

# Divide the interval by this on a change: two changes in a row bring an hourly source to
# under 4 minutes; a busy source stays at min_interval.
TIGHTEN = 4.0
# Multiply it by this per unchanged probe, from the GROW_AFTER-th in a row: one quiet probe
# after a change is common in a burst, so it is not yet a reason to slow down. Slow growth
# (2m to 30m takes some 55 quiet probes) keeps a source that changes every hour or two
# polled every few minutes; quick growth would park it at max_interval between changes
# (bench/bench_adaptive.py: 1.5 made the mean detection delay worse than a fixed interval).
GROW = 1.05
GROW_AFTER = 2

Kind = Literal["changed", "unchanged", "failed"]


@dataclass(frozen=True)
class Bounds:
    """A source's envelope: the shortest and longest interval, and where it starts."""

    min_interval: float
    max_interval: float
    start: float

    def clamp(self, seconds: float) -> float:
        """``seconds`` within the bounds.

        >>> Bounds(60, 3600, 300).clamp(10), Bounds(60, 3600, 300).clamp(1e9)
        (60, 3600)
        """
        return min(self.max_interval, max(self.min_interval, seconds))


@dataclass(frozen=True)
class Observation:
    """What one probe saw. ``retry_after``: seconds a failed request's server asked to wait."""

    kind: Kind
    retry_after: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class PollState:
    """Where a source's polling stands: its interval, the next due time (epoch seconds),
    unchanged probes and failures in a row, and why it is due when it is."""

    interval: float
    next_due: float
    quiet: int = 0
    failures: int = 0
    reason: str = "first probe"


def first_state(bounds: Bounds, now: float) -> PollState:
    """A source never probed: due now, at its start interval (clamped to the bounds)."""
    return PollState(interval=bounds.clamp(bounds.start), next_due=now)


def observe(state: PollState, seen: Observation, now: float, bounds: Bounds) -> PollState:
    """The state after a probe at ``now`` saw ``seen``.

    >>> b = Bounds(60, 3600, 600)
    >>> s = observe(first_state(b, 0), Observation("changed"), 0, b)
    >>> s.interval, s.next_due, s.reason
    (150.0, 150.0, 'changed: interval 10m -> 2m30s')
    >>> s = observe(s, Observation("unchanged"), 150, b)
    >>> s.interval, s.quiet
    (150.0, 1)
    >>> observe(s, Observation("unchanged"), 300, b).interval
    157.5
    >>> observe(PollState(60, 0), Observation("changed"), 0, b).reason  # at min_interval
    'changed: stays 1m (min_interval)'
    >>> f = observe(s, Observation("failed", retry_after=7200), 300, b)
    >>> f.interval, f.next_due - 300, f.failures, f.reason
    (150.0, 7200, 1, 'failed 1 in a row: waiting 2h (the server asked Retry-After 2h)')
    """
    interval = bounds.clamp(state.interval)  # the bounds may have changed in the file
    if seen.kind == "failed":
        failures = state.failures + 1
        backoff = min(bounds.max_interval, interval * 2**failures)
        wait = max(backoff, seen.retry_after or 0.0)
        why = f"failed {failures} in a row: waiting {spoken(wait)}"
        if seen.retry_after is not None and seen.retry_after >= backoff:
            why += f" (the server asked Retry-After {spoken(seen.retry_after)})"
        return replace(state, interval=interval, next_due=now + wait, failures=failures, reason=why)
    if seen.kind == "changed":
        tighter = bounds.clamp(interval / TIGHTEN)
        return PollState(
            interval=tighter, next_due=now + tighter, reason=_tightened(interval, tighter, bounds)
        )
    quiet = state.quiet + 1
    wider = bounds.clamp(interval * GROW) if quiet >= GROW_AFTER else interval
    why = f"unchanged {quiet} in a row: interval {spoken(wider)}"
    return PollState(interval=wider, next_due=now + wider, quiet=quiet, reason=why)


def _tightened(interval: float, tighter: float, bounds: Bounds) -> str:
    """Why a change set the interval it did; at the floor, that it stayed there.

    >>> b = Bounds(30, 3600, 600)
    >>> _tightened(600, 150, b)
    'changed: interval 10m -> 2m30s'
    >>> _tightened(60, 30, b)
    'changed: interval 1m -> 30s (min_interval)'
    """
    floor = " (min_interval)" if tighter <= bounds.min_interval else ""
    if tighter == interval:
        return f"changed: stays {spoken(interval)}{floor}"
    return f"changed: interval {spoken(interval)} -> {spoken(tighter)}{floor}"


def spoken(seconds: float) -> str:
    """A duration as people write it.

    >>> spoken(45), spoken(150), spoken(3600), spoken(5400), spoken(90060)
    ('45s', '2m30s', '1h', '1h30m', '1d1h1m')
    """
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    if left or not parts:
        parts.append(f"{left}s")
    return "".join(parts)
