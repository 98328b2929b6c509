"""When a source is due: fixed slots of its interval, shifted by a stable per-source jitter."""

from __future__ import annotations

import hashlib
import math

__all__ = ["due_slot", "jitter_offset"]


def jitter_offset(name: str, jitter: float) -> float:
    """A stable offset in ``[0, jitter)`` derived from the source name.

    Stable so that restarts never move a source's slots; spread so that sources with the same
    interval do not all hit the network in the same second.

    >>> jitter_offset("demo", 0)
    0.0
    >>> 0 <= jitter_offset("demo", 30) < 30
    True
    >>> jitter_offset("demo", 30) == jitter_offset("demo", 30)
    True
    """
    if jitter <= 0:
        return 0.0
    digest = hashlib.sha256(name.encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return fraction * jitter


def due_slot(now: float, interval: float, offset: float = 0.0) -> int:
    """Index of the interval slot containing ``now`` (epoch seconds).

    A sync is requested once per slot; the slot index is its run key, so however often the
    sensor ticks, one slot yields one run.

    >>> due_slot(1000.0, 300.0), due_slot(1199.0, 300.0), due_slot(1200.0, 300.0)
    (3, 3, 4)
    >>> due_slot(1205.0, 300.0, offset=10.0)
    3
    """
    return math.floor((now - offset) / interval)
