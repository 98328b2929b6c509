"""Webhooks into syncs: a sensor that syncs each source with pending deliveries, and the slower
polling that reconciles what a webhook missed.

The receiver (pipeline/webhooks/webhook_receiver.py) stores verified deliveries in the inbox
(pipeline/webhooks/webhook_inbox.py). Every few seconds this sensor reads the deliveries after its
cursor (the last inbox seq it saw) that no sync has covered, and requests a sync of each source they
are for: the source's ordinary sync run (sync, its watches, delivery), so a webhook's change is
typed, hashed, logged and notified exactly as a polled one, and a change seen by both is one change
(same key, same hash) and at most one notification (the outbox's dedupe key). The run key
comes from the delivery ids, so each delivery starts at most one run however often a tick is
evaluated; the sync, once committed, marks the deliveries it covered consumed
(pipeline/assets/sync_assets.py). Like the other sensors it never opens the warehouse.

Deliveries for several plain sources at one tick make one run of the batch job
(pipeline/assets/batched_syncs.py), as due syncs do: a run's start-up (some 5 core-seconds) is
then paid once per tick rather than once per source, which is what a steady stream of deliveries
to a few sources spends most of its CPU on.

A source whose webhook run waits in the queue, not started, gets no second one: that run's sync
will consume every delivery stored before it begins, the new ones too. Without this, a steady
stream of deliveries beyond the workers' pace queued one redundant run per source per tick, a
queue that only grew (14 runs behind after a minute of 5 deliveries a second to 4 sources on 2
workers, bench/bench_hosts_webhooks.py), and each new delivery waited behind all of them. If
the queued run is canceled before its sync begins, its deliveries wait for the source's next
run, as those of a failed sync do.

A source with ``webhook:`` is still polled, as reconciliation: every ``webhook.reconcile``
(default 1h) or its ``interval`` if that is longer, without probes, so whatever a webhook
missed arrives within one reconciliation interval.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import dagster as dg
from changewatch.pipeline.assets.batched_syncs import batch_run_config, split_batch
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.project.watches_file import DEFAULT_BATCH_MAX
from changewatch.pipeline.triggers.queued_syncs import queued_sources
from changewatch.pipeline.triggers.sync_sensors import TRIGGER_TAG
from changewatch.pipeline.webhooks.webhook_inbox import Inbox, Pending, open_inbox
from changewatch.pipeline.webhooks.webhook_inbox_postgres import PostgresInbox
from changewatch.sources.base import ProbeSettings, SourceBase
from changewatch.sources.fleet import is_fleet

__all__ = [
    "DELIVERIES_TAG",
    "WEBHOOK_SENSOR",
    "WEBHOOK_TICK_S",
    "WebhookRequest",
    "reconciling",
    "webhook_requests",
    "webhook_sensor",
]

WEBHOOK_SENSOR = "sync_on_webhook"
# How many deliveries a webhook-triggered run covers (for the UI; the inbox has the ids).
DELIVERIES_TAG = "changewatch/webhook_deliveries"
# The least seconds between ticks: reading the inbox costs a millisecond, and each second
# between ticks is a second of a webhook's latency. The daemon evaluates sensors every 5 s
# (dagster/_daemon/sensor.py); a minimum of 5 made it skip every pass that came a few ms
# early, so ticks came 10 s apart about half the time (bench/bench_webhooks.py). Below the
# daemon's pass, every pass ticks.
WEBHOOK_TICK_S = 1

S = TypeVar("S", bound=SourceBase)


@dataclass(frozen=True)
class WebhookRequest:
    """One sync to request for a source's pending deliveries."""

    source: str
    run_key: str
    deliveries: int


def webhook_requests(
    pending: Sequence[Pending], sources: Sequence[str]
) -> tuple[list[WebhookRequest], list[str]]:
    """A request per source among ``sources`` with pending deliveries, keyed by their ids;
    and the names of other sources found in the inbox (no longer configured).

    >>> pending = [Pending(1, "a", "d1"), Pending(2, "b", "x"), Pending(3, "a", "d2")]
    >>> requests, unknown = webhook_requests(pending, ["a"])
    >>> [(r.source, r.run_key, r.deliveries) for r in requests], unknown
    ([('a', 'a:webhook:a000e27b005e0fad', 2)], ['b'])
    """
    ids: dict[str, list[str]] = {}
    for item in pending:
        ids.setdefault(item.source, []).append(item.delivery_id)
    requests = [
        WebhookRequest(name, f"{name}:webhook:{_digest(sorted(ids[name]))}", len(ids[name]))
        for name in sorted(ids)
        if name in sources
    ]
    return requests, sorted(set(ids) - set(sources))


def _digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def _source(request: WebhookRequest) -> str:
    return request.source


def _batched(batch_job: dg.JobDefinition, requests: Sequence[WebhookRequest]) -> dg.RunRequest:
    """One run of ``batch_job`` syncing the sources of ``requests``, keyed by their keys."""
    keys = sorted(request.run_key for request in requests)
    return dg.RunRequest(
        # From the sources' own keys: a tick evaluated again asks the same run.
        run_key=f"webhook-batch:{_digest(keys)}",
        job_name=batch_job.name,
        run_config=batch_run_config(request.source for request in requests),
        tags={
            TRIGGER_TAG: "webhook",
            DELIVERIES_TAG: str(sum(request.deliveries for request in requests)),
        },
    )


def webhook_sensor(
    sources: Sequence[SourceBase],
    jobs: Mapping[str, dg.UnresolvedAssetJobDefinition],
    selections: Mapping[str, Sequence[dg.AssetKey]],
    *,
    inbox: Callable[[], Inbox | PostgresInbox] = open_inbox,
    batch_job: dg.JobDefinition | None = None,
    batch_max: int = DEFAULT_BATCH_MAX,
) -> dg.SensorDefinition:
    """The sensor that syncs ``sources`` (those with ``webhook:``) when deliveries wait for
    them; ``jobs`` holds the job of each source by its name, ``selections`` what its runs
    select (a fleet's: everything), ``inbox`` opens the inbox at a tick; ``batch_job``, if
    given, syncs several plain sources in a run, at most ``batch_max`` to a run."""
    names = [source.name for source in sources]
    fleets = {source.name: is_fleet(source) for source in sources}
    targets = {jobs[name].name: jobs[name] for name in names}
    targets |= {batch_job.name: batch_job} if batch_job is not None else {}

    @dg.sensor(
        name=WEBHOOK_SENSOR,
        jobs=list(targets.values()),
        minimum_interval_seconds=WEBHOOK_TICK_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Requests a sync of each source with webhook deliveries waiting in the inbox "
            "(`changewatch webhooks` receives them); one run per set of deliveries."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        store = inbox()
        after = int(context.cursor or 0)
        if after > store.last_seq():
            # The inbox file was replaced (deleted, restored): its seqs start again.
            context.log.warning("the webhook inbox %s is new: reading it from the start", store)
            after = 0
        pending = store.pending(after=after)
        requests, unknown = webhook_requests(pending, names)
        if unknown:
            context.log.warning(
                "webhook deliveries for sources no longer configured: %s", ", ".join(unknown)
            )
        waiting = queued_sources(
            context.instance, [request.source for request in requests], {TRIGGER_TAG: "webhook"}
        )
        for request in requests:
            if request.source in waiting:
                context.log.info(
                    f"{request.source}: {request.deliveries} deliveries join its queued run"
                )
        asked = [request for request in requests if request.source not in waiting]
        plain = [request for request in asked if not fleets[request.source]]
        batched = (
            [_batched(batch_job, chunk) for chunk in split_batch(plain, batch_max, _source)]
            if batch_job is not None and len(plain) > 1
            else []
        )
        if batched:
            asked = [request for request in asked if fleets[request.source]]
        runs = batched + [
            dg.RunRequest(
                run_key=request.run_key,
                job_name=jobs[request.source].name,
                asset_selection=None if fleets[request.source] else selections[request.source],
                tags={
                    SOURCE_TAG: request.source,
                    TRIGGER_TAG: "webhook",
                    DELIVERIES_TAG: str(request.deliveries),
                },
            )
            for request in asked
        ]
        cursor = str(max((item.seq for item in pending), default=after))
        return dg.SensorResult(run_requests=runs, cursor=cursor)

    return _sensor


def reconciling(source: S) -> S:
    """``source`` as the sync sensor polls it: a source with ``webhook:`` (and no cron) every
    ``webhook.reconcile`` or its interval, whichever is longer, without probes; others as
    they are.

    >>> from changewatch.sources.base import SourceBase
    >>> plain = dict(name="s", type="rest", table="t", primary_key="id", columns={"id": "bigint"})
    >>> hooked = SourceBase(**plain, webhook={"path": "/h", "secret_env": "H"})
    >>> polled = reconciling(hooked)
    >>> polled.interval, polled.probe.enabled, reconciling(SourceBase(**plain)).interval
    (3600.0, False, 900.0)
    """
    if source.webhook is None or source.cron is not None:
        return source
    every = max(source.interval, source.webhook.reconcile)
    return source.model_copy(update={"interval": every, "probe": ProbeSettings(enabled=False)})
