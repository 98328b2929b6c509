"""Freshness policies for sync assets: a scheduled source that stops syncing shows up in the UI."""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import islice, pairwise

import dagster as dg
from changewatch.pipeline.polling.sync_triggers import scheduled_by_default
from changewatch.sources import SourceConfig
from changewatch.sources.probe import has_probe
from dagster._utils.schedules import cron_string_iterator  # the cron parser Dagster itself uses

__all__ = ["MISSED_SYNCS_FAIL", "MISSED_SYNCS_WARN", "source_freshness", "sync_period"]

# Every sync materializes its asset, even one that found nothing new (304 or no change), so a
# stale asset means syncs stopped or keep failing (a probed source syncs at least once per
# probe.reconcile). One missed sync is noise (a slow walk, a
# deferred rate limit); two warn, three fail.
MISSED_SYNCS_WARN = 2
MISSED_SYNCS_FAIL = 3
MIN_WINDOW = timedelta(minutes=1)


def sync_period(source: SourceConfig) -> timedelta:
    """The longest time between two planned syncs of ``source``.

    An interval source waits at most its interval plus its jitter, or, when the sync sensor
    probes it (pipeline/polling/probe_decisions.py), its ``probe.reconcile`` plus jitter: an
    unchanged source gets no run until then. A cron source waits the longest gap between its firings
    over a week (``0 9 * * 1-5`` waits three days over a weekend).
    """
    if source.cron is None:
        every = source.interval
        if source.probe.enabled and has_probe(source):
            every = max(every, source.probe.reconcile)
        return timedelta(seconds=every + source.jitter)
    firings = cron_string_iterator(time.time(), source.cron, source.timezone)
    week = 7 * 24 * 3600
    gaps, first = [], None
    for earlier, later in pairwise(islice(firings, 10_000)):
        first = first or earlier
        gaps.append((later - earlier).total_seconds())
        if (later - first).total_seconds() >= week:
            break
    return timedelta(seconds=max(gaps))


def source_freshness(source: SourceConfig) -> dg.FreshnessPolicy | None:
    """Warn after two missed syncs, fail after three; ``None`` for a source nothing syncs
    until someone starts its trigger (the demo API's stopped sensor): it is not late, and a
    policy would turn the UI red some minutes after `changewatch demo`."""
    if not scheduled_by_default(source):
        return None
    period = sync_period(source)
    # Dagster refuses windows under a minute: a source polled every few seconds gets those.
    warn = max(period * MISSED_SYNCS_WARN, MIN_WINDOW)
    fail = max(period * MISSED_SYNCS_FAIL, warn + MIN_WINDOW)
    return dg.FreshnessPolicy.time_window(warn_window=warn, fail_window=fail)
