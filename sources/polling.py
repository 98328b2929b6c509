"""How a source is polled besides its interval: the adaptive envelope's bounds, and when to stop.

Settings only, validated once with the rest of the file. The rules that use them are
``pipeline/polling/adaptive_envelope.py`` (when to probe next) and
``pipeline/polling/probe_decisions.py`` (the sensor's decisions, pauses included); a pause is kept
in the Dagster instance (``pipeline/polling/source_pauses.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from changewatch.sources.base import SourceBase

__all__ = ["SourceStop", "StopConditions", "envelope_problem", "polling_problems"]


class StopConditions(BaseModel):
    """When a watch stops (a source takes ``max_failures`` too, see ``SourceStop``).

    ``until``: a date (polled through that day, UTC) or a time (naive means UTC).
    ``after_notifications``: once that many notifications were delivered (counted since the
    last ``changewatch resume``). Either one pauses it, with the reason, until resumed.
    """

    model_config = ConfigDict(extra="forbid")

    until: datetime | date | None = Field(
        default=None,
        description=(
            "A date (polled through that day, UTC) or a time (naive: UTC) after which it pauses."
        ),
    )
    after_notifications: int | None = Field(
        default=None,
        ge=1,
        description="Pause once this many notifications were delivered since the last resume.",
    )

    @field_validator("until", mode="before")
    @classmethod
    def _day(cls, value: Any) -> Any:
        # "2026-12-31" is a day (polled through it), not that day's first moment.
        if isinstance(value, str) and len(value.strip()) == 10:
            return date.fromisoformat(value.strip())
        return value

    @property
    def active(self) -> bool:
        """Whether any condition is set (only then is there a pause to keep or check)."""
        return any(value is not None for value in self.model_dump().values())

    def deadline(self) -> float | None:
        """``until`` as epoch seconds: the end of a date's day, a naive time taken as UTC.

        >>> day, noon = StopConditions(until="2026-12-30"), StopConditions(until="2026-12-31T12:00")
        >>> datetime.fromtimestamp(day.deadline(), UTC).isoformat()
        '2026-12-31T00:00:00+00:00'
        >>> noon.deadline() - day.deadline()
        43200.0
        """
        until = self.until
        if until is None:
            return None
        if not isinstance(until, datetime):
            until = datetime.combine(until + timedelta(days=1), time(), tzinfo=UTC)
        elif until.tzinfo is None:
            until = until.replace(tzinfo=UTC)
        return until.timestamp()


class SourceStop(StopConditions):
    """A source's stop conditions: a watch's, and ``max_failures`` failed probes in a row."""

    max_failures: int | None = Field(
        default=None, ge=1, description="Pause after this many failed change probes in a row."
    )


def envelope_problem(source: SourceBase) -> str | None:
    """What is wrong with one source's envelope bounds, or None.

    >>> from changewatch.sources.base import SourceBase
    >>> plain = dict(name="s", type="rest", table="t", primary_key="id", columns={"id": "bigint"})
    >>> SourceBase(**plain, min_interval="1m", max_interval="1h").min_interval
    60.0
    >>> envelope_problem(SourceBase.model_construct(**plain, min_interval=60.0, max_interval=None))
    'set both min_interval and max_interval (the adaptive envelope), or neither'
    """
    low, high = source.min_interval, source.max_interval
    if low is None and high is None:
        return None
    if low is None or high is None:
        return "set both min_interval and max_interval (the adaptive envelope), or neither"
    if not 0 < low <= high:
        return f"min_interval ({low:g}s) must be above 0 and at most max_interval ({high:g}s)"
    if source.cron is not None:
        return "min_interval and max_interval adapt an interval: a cron source has none"
    return None


def polling_problems(sources: Sequence[SourceBase]) -> list[tuple[tuple, str]]:
    """What the polling settings of ``sources`` get wrong: (location, why), for the file's
    cross-checks. The envelope and ``max_failures`` go by change probes, so they need a source
    that sends them; stop conditions need the sync sensor, so cron, webhook and fleet sources
    (other triggers) refuse them."""
    from changewatch.sources.fleet import is_fleet  # it imports the source types, they this
    from changewatch.sources.probe import has_probe

    problems: list[tuple[tuple, str]] = []
    for index, source in enumerate(sources):
        probed = source.probe.enabled and has_probe(source)
        if source.min_interval is not None and (source.webhook is not None or not probed):
            why = (
                "a source with webhook: is polled only to reconcile, at webhook.reconcile"
                if source.webhook is not None
                else "the envelope adapts to what change probes see, and this source sends none"
            )
            problems.append((("sources", index, "min_interval"), why))
        if not source.stop.active:
            continue
        other = (
            "a cron schedule"
            if source.cron is not None
            else "webhooks"
            if source.webhook is not None
            else "a fleet's sensor"
            if is_fleet(source)
            else None
        )
        if other is not None:
            why = f"stop conditions work on interval sources; this one is synced by {other}"
            problems.append((("sources", index, "stop"), why))
        elif source.stop.max_failures is not None and not probed:
            why = "max_failures counts failed change probes, and this source sends none"
            problems.append((("sources", index, "stop", "max_failures"), why))
    return problems
