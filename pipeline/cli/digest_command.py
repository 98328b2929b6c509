"""One day's digest by hand (`changewatch digest`, the demo): the whole day, or the day so far."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
from changewatch.channels.config import DigestConfig
from changewatch.channels.outbox import DigestWindowOpen, send_digest_window
from changewatch.evaluators.debounce import settle_debounced
from changewatch.pipeline.cli.in_process_runs import instance, run_job
from changewatch.pipeline.definitions.build_definitions import digest_job_name
from changewatch.pipeline.project.expected_errors import UsageError
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.warehouse import connect

__all__ = ["day_window", "send_day"]


def day_window(digest: DigestConfig, day: date) -> tuple[datetime, datetime]:
    """Local midnight of `day` to the next one, in the digest's zone: its partition's window."""
    tz = ZoneInfo(digest.timezone)
    return datetime.combine(day, time(), tz), datetime.combine(day + timedelta(days=1), time(), tz)


def send_day(
    config: ChangewatchConfig,
    digest: DigestConfig,
    day: date,
    *,
    partial: bool = False,
    dagster_instance: dg.DagsterInstance | None = None,
) -> dict[str, Any]:
    """Send the digest of `day`; return what it came to (the digest asset's metadata).

    The whole day is the day's partition of the digest asset, materialized in Dagster and
    sent once; a day that has not ended raises DigestWindowOpen, because what comes later
    that day would reach no digest. `partial` sends the day so far straight from the
    warehouse and records nothing, neither the window nor a partition: the day stays open;
    a day that has ended is not partial (UsageError).
    """
    start, end = day_window(digest, day)
    if partial and end <= datetime.now(UTC):
        # "So far" of a day that has ended would be all of it, sent as a draft: refused.
        raise UsageError(
            f"digest {digest.name!r}: {day} ended at {end:%Y-%m-%d %H:%M} ({digest.timezone}), "
            "so --partial (the day so far) does not apply; without --partial it is sent whole"
        )
    if partial:
        channel = config.channel(digest.channel) if digest.channel else None
        with connect(os.environ.get(WAREHOUSE_URL_ENV)) as wh:
            settle_debounced(
                wh,
                [config.watch(name) for name in digest.watches],
                {s.name: s for s in config.sources},
            )
            result = send_digest_window(
                wh,
                digest,
                channel,
                window_start=start,
                window_end=end,
                headings=config.headings(digest),
                partial=True,
                feedback=config.feedback,
            )
        return result.metadata()
    if end > datetime.now(UTC):
        raise DigestWindowOpen(
            f"digest {digest.name!r}: {day} is not over until {end:%Y-%m-%d %H:%M} "
            f"({digest.timezone}), and each day's digest is sent once, after it has ended "
            "(--partial sends the items so far and leaves the day open)"
        )
    first = digest.first_day(datetime.now(ZoneInfo(digest.timezone)).date())
    if day < first:
        raise ValueError(
            f"digest {digest.name!r} starts on {first}: set `start:` on it in the watches "
            f"file to send {day}"
        )
    # The digest's own job, the one its schedule runs: the UI lists both kinds of runs together.
    results = run_job(
        config,
        digest_job_name(digest.name),
        dagster_instance or instance(),
        partition_key=day.isoformat(),
    )
    return results[f"digest_{digest.name}"]
