"""Evaluation, delivery and digest assets: sync -> evaluation -> notifications -> digest."""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import time
import traceback
from datetime import datetime
from zoneinfo import ZoneInfo

import dagster as dg
from changewatch.channels.config import DigestConfig
from changewatch.evaluators.config import Watch
from changewatch.evaluators.evaluate import EvaluationStats, evaluate_watch
from changewatch.pipeline.assets.asset_signatures import shared_signature
from changewatch.pipeline.assets.notification_stops import apply_notification_stops
from changewatch.pipeline.polling.source_pauses import (
    NOT_PAUSED_CHECK,
    not_paused_result,
    stop_reason,
)
from changewatch.pipeline.project.expected_errors import redact
from changewatch.pipeline.project.warehouse_resource import (
    JudgeResource,
    WarehouseResource,
    warehouse_pool,
)
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from dagster import AssetExecutionContext

__all__ = [
    "EVALUATED_CHECK",
    "EVALUATION_FAILED",
    "EVALUATION_TRACE",
    "HELD_CHECK",
    "JUDGE_CHECK",
    "NOTIFICATIONS_ASSET",
    "WATCH_TAG",
    "digest_asset",
    "digest_partitions",
    "evaluation_asset",
    "evaluation_asset_name",
    "first_line",
    "notifications_asset",
]

WATCH_TAG = "changewatch/watch"
NOTIFICATIONS_ASSET = "notifications"
JUDGE_CHECK = "judge_available"
HELD_CHECK = "no_held_changes"
EVALUATED_CHECK = "evaluated"
# The metadata key of a failed evaluation: its one-line error (see _failed).
EVALUATION_FAILED = "evaluation_failed"
EVALUATION_TRACE = "evaluation_traceback"


def evaluation_asset_name(watch: Watch) -> str:
    return f"eval_{watch.name}"


def evaluation_asset(
    watch: Watch, config: ChangewatchConfig, *, warehouse_url: str
) -> dg.AssetsDefinition:
    """The asset that evaluates ``watch``'s new changes into evaluations and notifications."""
    sources = {name: config.source(name) for name in watch.sources}
    filters = config.filters(watch)
    judged = (
        f" then asks {watch.judge.model} whether: {watch.judge.condition}" if watch.judge else ""
    )

    @dg.asset(
        name=evaluation_asset_name(watch),
        group_name="evaluation",
        # On PostgreSQL a pool per watch: an evaluation holds `changewatch:evaluate:<watch>`
        # while it reads and advances the watch's watermark, and the outbox's UNIQUE
        # dedupe_key admits each notification once, so different watches run at once.
        pool=warehouse_pool(warehouse_url, "watch", watch.name),
        deps=[dg.AssetKey(source.table) for source in sources.values()],
        kinds={"sql", "python"} | ({"openai"} if watch.judge else set()),
        tags={WATCH_TAG: watch.name},
        check_specs=_check_specs(watch),
        description=(
            watch.description
            or f"Watch {watch.name}: filters the new changes of {', '.join(sources)} with "
            f"`{watch.where}`{judged}; writes `evaluations` and queues notifications in "
            f"`outbox` (dedupe {watch.dedupe})."
        ),
    )
    @shared_signature  # Dagster reads it ~17 times (pipeline/assets/asset_signatures.py)
    def _evaluate(
        context: AssetExecutionContext, warehouse: WarehouseResource, judges: JudgeResource
    ) -> dg.MaterializeResult:
        return evaluation_result(watch, sources, filters, context, warehouse, judges)

    return _evaluate


def evaluation_result(
    watch: Watch,
    sources: dict,
    filters: dict,
    context,
    warehouse: WarehouseResource,
    judges: JudgeResource,
) -> dg.MaterializeResult:
    """What an evaluation of ``watch`` reports: its counts and checks (a failed evaluation is
    recorded, not raised). The body of the evaluation asset, and of each evaluation in a
    batched run's one step (pipeline/assets/batched_syncs.py)."""
    stopped = _stopped(context, watch)
    if stopped is not None:
        return _paused(context, watch, stopped)
    try:
        judge = judges.judge_for(watch)
        with warehouse.connect() as wh:
            stats = evaluate_watch(wh, watch, sources, filters, judge=judge)
    except Exception as error:  # noqa: BLE001 - one watch's failure is its own (see below)
        return _failed(context, watch, error)
    if stats.held:
        context.log.warning(
            f"{watch.name}: {stats.held} change(s) held: the judge was unavailable "
            f"({watch.judge.on_unavailable if watch.judge else ''} policy) or the per-run "
            "call cap or the daily budget was reached; they are evaluated again next run"
        )
    for note in stats.notes:
        context.log.warning(f"{watch.name}: {note}")
    # The counts are the materialization's metadata, not an info line: one event-log write
    # less per evaluation (issue 31, point 5).
    return dg.MaterializeResult(
        metadata={
            "changes_read": stats.changes_read,
            "passed_filter": stats.passed_filter,
            "judged": stats.judged,
            "judge_cache_hits": stats.judge_cache_hits,
            "judge_errors": stats.judge_errors,
            "filter_errors": stats.filter_errors,
            "notified": stats.notified,
            "suppressed_duplicates": stats.suppressed_duplicates,
            "held": stats.held,
            "dropped": stats.dropped,
            **(
                {"daily_budget": stats.daily_budget, "held_for_budget": stats.held_for_budget}
                if stats.daily_budget is not None
                else {}
            ),
            "judge_calls": stats.judge_calls,
            "judge_requests": stats.judge_requests,
            "prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            **(
                {"judge_cost_usd": dg.MetadataValue.float(stats.judge_cost_usd)}
                if stats.judge_cost_usd is not None
                else {}
            ),
            "duration_s": dg.MetadataValue.float(stats.duration_s),
            "judge_unavailable": stats.judge_unavailable,
        },
        check_results=[_evaluated_check(), _held_check(stats)]
        + ([_judge_check(stats)] if watch.judge else [])
        + _going_on(watch),
    )


def _stopped(context: AssetExecutionContext, watch: Watch) -> str | None:
    """Why ``watch`` is stopped (pipeline/polling/source_pauses.py), or None."""
    if not watch.stop.active:
        return None
    return stop_reason(context.instance, "watch", watch.name, watch.stop.deadline(), time.time())


def _going_on(watch: Watch) -> list[dg.AssetCheckResult]:
    """The passing ``not_paused`` result of a watch with stop conditions that evaluated."""
    return [not_paused_result("watch", watch.name, {}, time.time())] if watch.stop.active else []


def _paused(context: AssetExecutionContext, watch: Watch, reason: str) -> dg.MaterializeResult:
    """A stopped watch evaluates nothing: its changes wait (its watermark stays) for
    `changewatch resume`; every declared check reports, `not_paused` failing with why."""
    context.log.warning(f"{watch.name}: stopped, nothing evaluated: {reason}")
    checks = [
        dg.AssetCheckResult(
            check_name=EVALUATED_CHECK, passed=True, description=f"stopped: {reason}"
        ),
        dg.AssetCheckResult(
            check_name=HELD_CHECK, passed=True, description="stopped: changes wait for resume"
        ),
        not_paused_result("watch", watch.name, {}, time.time(), reason=reason),
    ]
    if watch.judge:
        checks.append(
            dg.AssetCheckResult(
                check_name=JUDGE_CHECK,
                passed=True,
                severity=dg.AssetCheckSeverity.WARN,
                description="not asked: the watch is stopped",
            )
        )
    return dg.MaterializeResult(metadata={"stopped": reason}, check_results=checks)


def _failed(context: AssetExecutionContext, watch: Watch, error: Exception) -> dg.MaterializeResult:
    """A failed evaluation, recorded rather than raised.

    Raising would fail the step, and Dagster skips every step downstream of a failed one:
    the `notifications` asset, so one broken watch would stop every other watch's delivery.
    Nothing of this watch was settled (its watermark moves only with its evaluations, in one
    transaction), so its changes wait for the next run; the failed `evaluated` check marks
    the asset in the UI and the CLI's summary names the watch and exits non-zero.
    """
    message = redact(first_line(error))
    trace = redact("".join(traceback.format_exception(error)))
    context.log.error(f"{watch.name}: evaluation failed, its changes wait: {message}\n{trace}")
    # Every declared check reports (Dagster requires it): the changes wait, as the held
    # check says; the judge was not asked, so nothing is known against it.
    checks = [
        dg.AssetCheckResult(
            check_name=EVALUATED_CHECK,
            passed=False,
            metadata={"error": message},
            description=f"the evaluation failed: {message}",
        ),
        dg.AssetCheckResult(
            check_name=HELD_CHECK,
            passed=False,
            description="the evaluation failed: every new change waits for the next run",
        ),
    ]
    if watch.judge:
        checks.append(
            dg.AssetCheckResult(
                check_name=JUDGE_CHECK,
                passed=True,
                severity=dg.AssetCheckSeverity.WARN,
                description="not asked: the evaluation failed before judging",
            )
        )
    checks += _going_on(watch)
    return dg.MaterializeResult(
        # The traceback for `--debug` (the CLI's summary shows only the message).
        metadata={EVALUATION_FAILED: message, EVALUATION_TRACE: dg.MetadataValue.text(trace)},
        check_results=checks,
    )


def first_line(error: Exception) -> str:
    """The error's first line, as the database or our code worded it."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _check_specs(watch: Watch) -> list[dg.AssetCheckSpec]:
    evaluated = dg.AssetCheckSpec(
        EVALUATED_CHECK,
        asset=evaluation_asset_name(watch),
        description=(
            "Fails when the evaluation itself failed (a filter broken on most changes, the "
            "warehouse): none of the watch's changes were settled, they wait for the next run. "
            "Other watches and delivery go on."
        ),
    )
    held = dg.AssetCheckSpec(
        HELD_CHECK,
        asset=evaluation_asset_name(watch),
        description=(
            "Fails while changes wait: held because the judge did not answer or a call cap "
            "or the daily budget was reached, or because the filter failed on their values. "
            "Each run tries them again."
        ),
    )
    paused = [
        dg.AssetCheckSpec(
            NOT_PAUSED_CHECK,
            asset=evaluation_asset_name(watch),
            description=(
                "Fails while the watch is stopped by one of its stop conditions (until, "
                "after_notifications): it evaluates nothing and its changes wait; "
                f"`changewatch resume {watch.name}` resumes it."
            ),
        )
    ]
    if watch.judge is None:
        return [evaluated, held] + (paused if watch.stop.active else [])
    meanwhile = {"hold": "held", "drop": "dropped", "notify": "notified unjudged"}
    return [
        evaluated,
        held,
        dg.AssetCheckSpec(
            JUDGE_CHECK,
            asset=evaluation_asset_name(watch),
            description=(
                f"Warns while the judge ({watch.judge.model}) does not answer; meanwhile changes "
                f"are {meanwhile[watch.judge.on_unavailable]}."
            ),
        ),
    ] + (paused if watch.stop.active else [])


def _evaluated_check() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=EVALUATED_CHECK, passed=True, description="the evaluation ran"
    )


def _held_check(stats: EvaluationStats) -> dg.AssetCheckResult:
    waiting = stats.held + stats.filter_errors
    return dg.AssetCheckResult(
        check_name=HELD_CHECK,
        passed=waiting == 0,
        metadata={"held": stats.held, "filter_errors": stats.filter_errors},
        description=(
            f"{stats.held} change(s) held, {stats.filter_errors} failed the filter's run"
            if waiting
            else "nothing waits"
        ),
    )


def _judge_check(stats: EvaluationStats) -> dg.AssetCheckResult:
    # WARN, not ERROR: the watch did its job (held what it could not judge); the model is down.
    down = bool(stats.judge_unavailable)
    return dg.AssetCheckResult(
        check_name=JUDGE_CHECK,
        passed=not down,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"held": stats.held, "dropped": stats.dropped, "judge_errors": stats.judge_errors},
        description=(
            f"judge {stats.judge_unavailable}: {stats.held} held" if down else "the judge answered"
        ),
    )


def notifications_asset(config: ChangewatchConfig, *, warehouse_url: str) -> dg.AssetsDefinition:
    """The asset that delivers due notifications to their channels, with retries.

    Debounced notifications whose window has ended are settled first (released or
    suppressed), so the pass that releases one also sends it.
    """
    from changewatch.pipeline.assets.channel_checks import channels_check_spec

    sources = {s.name: s for s in config.sources}

    @dg.asset(
        name=NOTIFICATIONS_ASSET,
        group_name="delivery",
        # On PostgreSQL its own pool: each delivery is claimed by a conditional UPDATE before
        # it is sent, so deliverers never send one twice; one slot just saves the wasted claims.
        pool=warehouse_pool(warehouse_url, "notifications"),
        deps=[dg.AssetKey(evaluation_asset_name(w)) for w in config.watches],
        kinds={"email", "python"},
        check_specs=[channels_check_spec(NOTIFICATIONS_ASSET)],
        description=(
            "Sends every due notification in `outbox` to its channels "
            f"({', '.join(c.name for c in config.channels) or 'none configured'}), recording "
            "each attempt in `deliveries`; failures retry on each channel's schedule (about "
            "three days by default), then go to the dead-letter state; a channel that keeps "
            "failing is paused and probed (`channels_open` shows it). Debounced notifications "
            "whose window has ended are released or suppressed first."
        ),
    )
    def _deliver(
        context: AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        return delivery_result(config, sources, context, warehouse)

    return _deliver


def delivery_result(
    config: ChangewatchConfig, sources: dict, context, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """What a delivery pass reports: settles debounced notifications, sends what is due, and
    applies notification stops. The body of the notifications asset, and the last part of a
    batched run's one step (pipeline/assets/batched_syncs.py)."""
    from changewatch.channels.circuit import load_circuits
    from changewatch.channels.outbox import DeliveryPolicy, deliver_due
    from changewatch.evaluators.debounce import settle_debounced
    from changewatch.pipeline.assets.channel_checks import channels_check

    with warehouse.connect() as wh:
        settled = settle_debounced(wh, config.watches, sources)
        stats = deliver_due(
            wh,
            config.channels,
            policy=DeliveryPolicy.from_config(config.delivery),
            feedback=config.feedback,
        )
        circuits = load_circuits(wh)
        # What was delivered may reach a stop.after_notifications
        # (pipeline/polling/source_pauses.py).
        stops = apply_notification_stops(wh, context.instance, config, now=time.time())
    for line in settled.log + stats.log:
        context.log.info(line)
    for line in stops:
        context.log.warning(line)
    paused = {"paused": ", ".join(stops)} if stops else {}
    check = channels_check([c.name for c in config.channels], circuits)
    return dg.MaterializeResult(
        metadata=stats.metadata() | settled.metadata() | paused, check_results=[check]
    )


def digest_partitions(digest: DigestConfig) -> dg.DailyPartitionsDefinition:
    # Only days that have ended are partitions: a day's digest is sent once, so sending it
    # before the day is over would lose what comes later (`digest --partial` previews it).
    today = datetime.now(ZoneInfo(digest.timezone)).date()
    return dg.DailyPartitionsDefinition(
        start_date=digest.first_day(today).isoformat(), timezone=digest.timezone
    )


def digest_asset(
    digest: DigestConfig, config: ChangewatchConfig, *, warehouse_url: str
) -> dg.AssetsDefinition:
    """A daily-partitioned digest email of the notifications of some watches."""
    from changewatch.channels.outbox import send_digest_window
    from changewatch.evaluators.debounce import settle_debounced

    channel = config.channel(digest.channel) if digest.channel else None
    watches = [config.watch(name) for name in digest.watches]
    sources = {s.name: s for s in config.sources}
    headings = config.headings(digest)

    @dg.asset(
        name=f"digest_{digest.name}",
        group_name="digest",
        # On PostgreSQL a pool per digest: a day is claimed in `digests` (its primary key)
        # before it is sent, so it goes out once; other digests and syncs may run meanwhile.
        pool=warehouse_pool(warehouse_url, "digest", digest.name),
        partitions_def=digest_partitions(digest),
        deps=[dg.AssetKey(NOTIFICATIONS_ASSET)],
        kinds={"email"},
        description=(
            f"Digest {digest.name}: one email per day ({digest.timezone}) of the notifications "
            f"of {', '.join(digest.watches)}, grouped by watch; each day is sent once it has "
            "ended, and once (recorded in `digests`), so re-runs and backfills never send it "
            "twice."
        ),
    )
    def _digest(
        context: AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        window = context.partition_time_window
        with warehouse.connect() as wh:
            # A debounced notification belongs to the window its debounce ended in: settled
            # first, so the window lists it if it stands and never lists a flap.
            settle_debounced(wh, watches, sources)
            result = send_digest_window(
                wh,
                digest,
                channel,
                window_start=window.start,
                window_end=window.end,
                headings=headings,
                feedback=config.feedback,
            )
        context.log.info(f"digest {digest.name} {context.partition_key}: {result.status}")
        return dg.MaterializeResult(metadata=result.metadata())

    return _digest
