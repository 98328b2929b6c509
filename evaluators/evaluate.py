"""One evaluation of one watch: new changes -> SQL filter -> judge -> evaluations + outbox.

Reads the changes after the watch's watermark (plus the ones it held), filters them inside the
warehouse, asks the judge only about the survivors (each verdict cached by content, and saved
the moment it arrives), then writes the evaluations, the notifications and the new watermark
in one transaction. Notifications are keyed by data, so running this twice, concurrently, or
again after a crash never creates a second one.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

import polars as pl
from changewatch.channels.base import notification_id_for
from changewatch.evaluators.cascade import AnyJudge
from changewatch.evaluators.change_logs import has_change_log, not_synced_note
from changewatch.evaluators.config import Watch
from changewatch.evaluators.filters import CompiledFilter
from changewatch.evaluators.judge import ChangeForJudge, JudgeOutcome, Verdict, judge_version
from changewatch.evaluators.judge_budget import CallBudget, open_budget, record_spend
from changewatch.evaluators.judge_prompts import save_prompt
from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import changes_table, ensure_evaluation_tables
from changewatch.warehouse.statements import quote, render
from jinja2 import Template, TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment

__all__ = [
    "MAX_FILTER_ERRORS",
    "EvaluationStats",
    "FilterRuntimeError",
    "condition_version",
    "dedupe_key",
    "evaluate_watch",
]

_TEMPLATES = SandboxedEnvironment(autoescape=False)
# After this many failures of the judge's server in a row (connection, timeout, 5xx: not a
# change too long or an invalid answer), the rest of the run treats the judge as down.
_BREAKER = 3
# A filter that fails on more changes than this in one run is broken, not fed a few odd values:
# the evaluation fails (every change waits for the fix) rather than hold changes one by one.
MAX_FILTER_ERRORS = 20


class FilterRuntimeError(Exception):
    """A watch's filter fails on many changes' values: the filter needs fixing."""


@dataclass
class EvaluationStats:
    """What one evaluation did; every field is also materialization metadata."""

    watch: str
    changes_read: int = 0
    passed_filter: int = 0
    judged: int = 0  # calls the model answered with a verdict
    judge_cache_hits: int = 0
    notified: int = 0
    suppressed_duplicates: int = 0
    held: int = 0
    dropped: int = 0
    judge_errors: int = 0
    # Changes the filter failed on (their values broke it at run time): held, retried each run.
    filter_errors: int = 0
    # The watch's daily budget of judge calls, when this run reached it, and the changes it
    # held for that (judged once the next UTC day's budget opens).
    daily_budget: int | None = None
    held_for_budget: int = 0
    # Judgements asked of the model this run (answered or not; retries not counted again),
    # the HTTP requests they took, and what they cost (None: no price configured).
    judge_calls: int = 0
    judge_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    judge_cost_usd: float | None = None
    duration_s: float = 0.0
    # Empty, or why the judge failed this run: "unreachable at <url>" (no connection), else
    # "unavailable at <url> (<reason>)".
    judge_unavailable: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def condition_version(watch: Watch) -> str:
    """Hash of what decides whether a change notifies: the filter and the judge's prompt.

    Part of every dedupe key: editing the condition may notify again about the same object.
    """
    judged = judge_version(watch.judge) if watch.judge else ""
    return hashlib.sha256(f"{watch.where}\x00{judged}".encode()).hexdigest()[:16]


def dedupe_key(
    watch: Watch,
    source: str,
    object_key: str,
    old_hash: str | None,
    new_hash: str | None,
    version: str,
) -> str:
    """The data-derived key a notification is unique by, per the watch's dedupe policy.

    >>> from changewatch.evaluators.config import Watch
    >>> w = Watch(name="w", sources=["s"], dedupe="per_object")
    >>> dedupe_key(w, "s", "7", "a", "b", "v1")
    'w|s|7|v1'
    """
    if watch.dedupe == "per_object":
        part = ""
    elif watch.dedupe == "per_version":
        part = new_hash or f"deleted:{old_hash}"
    else:  # per_transition
        part = f"{old_hash or ''}>{new_hash or ''}"
    return "|".join(p for p in (watch.name, source, object_key, part, version) if p)


def evaluate_watch(
    wh: Warehouse,
    watch: Watch,
    sources: Mapping[str, SourceBase],
    filters: Mapping[str, CompiledFilter],
    *,
    judge: AnyJudge | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> EvaluationStats:
    """Evaluate every unsettled change of ``watch`` over its ``sources``; return the counts.

    ``filters`` maps each source name to the watch's compiled filter for that source.
    ``judge`` is required when the watch declares one (the caller builds it, so tests and
    deployments choose the endpoint).
    """
    started = time.perf_counter()
    stats = EvaluationStats(watch=watch.name)
    version = condition_version(watch)
    with wh.transaction():
        ensure_evaluation_tables(wh)
    budget = open_budget(wh, watch.name, watch.judge, now().date()) if watch.judge else None
    for name in watch.sources:
        source = sources[name]
        if not has_change_log(wh, source):
            # No watermark recorded either: its first sync's changes are read in full.
            stats.notes.append(not_synced_note(source))
            continue
        changes = _candidates(wh, watch, source, filters[name])
        stats.changes_read += changes.height
        if changes.is_empty():
            continue
        failed = changes.filter(pl.col("_filter_error").is_not_null())
        for change_id, key, message in failed.select(
            "change_id", "object_key", "_filter_error"
        ).iter_rows():
            stats.notes.append(
                f"the filter failed on {name} change {change_id} (object {key}), held: {message}"
            )
        passed = changes.filter(pl.col("_passed"))
        stats.passed_filter += passed.height
        verdicts: dict[int, _Decision] = {}
        if watch.judge is not None and passed.height:
            assert judge is not None, f"watch {watch.name!r} declares a judge but none was given"
            assert budget is not None
            verdicts = judge_changes(
                wh, watch, source, passed, judge, budget, stats, day=now().date()
            )
        evaluated_at = now()
        model = judge.model_id if judge is not None else None
        evaluations, outbox = _decide(
            watch, source, changes, verdicts, version, evaluated_at, model=model
        )
        _commit(wh, watch, source, changes, evaluations, outbox, version, evaluated_at, stats)
    if watch.judge is not None:
        stats.judge_cost_usd = watch.judge.cost(stats.prompt_tokens, stats.completion_tokens)
    stats.duration_s = round(time.perf_counter() - started, 3)
    return stats


@dataclass
class _Decision:
    """The judge's part of one change's evaluation."""

    decision: str  # notify | skip | held | dropped
    verdict: Verdict | None = None
    outcome: JudgeOutcome | None = None
    cache_hit: bool = False
    error: str | None = None


def _candidates(
    wh: Warehouse, watch: Watch, source: SourceBase, compiled: CompiledFilter
) -> pl.DataFrame:
    changes = quote(changes_table(source.table))
    rows = wh.fetch(render("select_watch_state", wh.dialect), (watch.name, source.name))
    if rows:
        watermark = rows[0][0]
    else:
        watermark = wh.fetch(
            render("select_watch_start", wh.dialect, changes=changes), (source.name,)
        )[0][0]
        # Recorded at once: if this first evaluation fails, the next one starts here too.
        with wh.transaction():
            wh.execute(
                render("upsert_watch_state", wh.dialect),
                (watch.name, source.name, watermark, None, datetime.now(UTC)),
            )
    params = (watermark, watch.name, source.name)
    condition = compiled.to_sql(wh.dialect, alias="c")  # type: ignore[arg-type]
    try:
        # A transaction of its own: on PostgreSQL a failed statement spoils the one it is in.
        with wh.transaction():
            return wh.fetch_frame(
                render("select_candidate_changes", wh.dialect, changes=changes, filter=condition),
                params,
            ).with_columns(pl.lit(None, pl.String).alias("_filter_error"))
    except Exception as error:  # noqa: BLE001 - maybe the filter failed on some change's values
        return _isolate_filter_errors(wh, watch, source, changes, condition, params, error)


def _isolate_filter_errors(
    wh: Warehouse,
    watch: Watch,
    source: SourceBase,
    changes: str,
    condition: str,
    params: tuple[Any, ...],
    error: Exception,
) -> pl.DataFrame:
    """The candidates, when the filter failed at run time: the changes it fails on are held.

    A filter checked at load can still fail on values (a cast of a text that is no number,
    a division by zero on PostgreSQL). The filter (``condition``, over the change log
    ``changes``) is run on halves of a failing id range until each failure is pinned to one
    change; those get ``_filter_error``, the rest their verdict, so a few odd changes do not
    stop the watch. Raises ``FilterRuntimeError`` when the filter fails on more than
    ``MAX_FILTER_ERRORS`` new changes, and the first error again when the failure is not
    about values (no candidates, it fails on none, or it passes on each).
    """
    with wh.transaction():
        # If this fails as well, the warehouse is the problem: that error propagates.
        candidates = wh.fetch_frame(
            render("select_candidate_changes", wh.dialect, changes=changes, filter="NULL"), params
        )
    ids = candidates.get_column("change_id").to_list()
    statement = render("select_filter_range", wh.dialect, changes=changes, filter=condition)
    if not ids or _fails_on_no_change(wh, statement):
        raise error  # no change to blame, or it fails without any: not about values
    watermark = params[0]
    passed: set[int] = set()
    failed: dict[int, str] = {}
    ranges = [(0, len(ids))]  # [start, end) positions in ids, a stack: lowest ids first
    while ranges:
        start, end = ranges.pop()
        try:
            with wh.transaction():
                rows = wh.fetch(statement, (ids[start], ids[end - 1], ids[start:end]))
        except Exception as range_error:  # noqa: BLE001 - narrowed down below
            if end - start > 1:
                middle = (start + end) // 2
                ranges += [(middle, end), (start, middle)]
                continue
            failed[ids[start]] = _first_line(range_error)
            # Changes held from earlier runs do not count: a few odd values a day must not
            # add up to a stopped watch.
            if sum(change_id > watermark for change_id in failed) > MAX_FILTER_ERRORS:
                raise FilterRuntimeError(
                    f"watch {watch.name!r}: its filter fails on more than {MAX_FILTER_ERRORS} "
                    f"new changes of {source.name!r} (change {ids[start]}: "
                    f"{failed[ids[start]]}); fix `where: {watch.where}`: the changes wait"
                ) from range_error
            continue
        passed.update(change_id for change_id, ok in rows if ok)
    if not failed:
        raise error
    return candidates.with_columns(
        pl.col("change_id").is_in(list(passed)).alias("_passed"),
        pl.col("change_id")
        .replace_strict(failed, default=None, return_dtype=pl.String)
        .alias("_filter_error"),
    )


def _fails_on_no_change(wh: Warehouse, statement: str) -> bool:
    """Does the filter range query fail with no change to read (a plan-time error)?"""
    try:
        with wh.transaction():
            wh.fetch(statement, (0, -1, []))
    except Exception:  # noqa: BLE001 - any failure here is not about values
        return True
    return False


def _first_line(error: Exception) -> str:
    """The database's own words: the first line, without the PostgreSQL driver's prefix.

    >>> _first_line(Exception('INVALID_DATA: [libpq] ... ERROR:  invalid input "x"\\nDETAIL'))
    'invalid input "x"'
    """
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line.rpartition("ERROR:")[2].strip()[:500]


def _content_hash(row: Mapping[str, Any]) -> str:
    return row["new_hash"] or f"deleted:{row['old_hash']}"


def _values(row: Mapping[str, Any], prefix: str, columns: list[str]) -> dict[str, Any] | None:
    if (prefix == "old_" and row["kind"] == "insert") or (
        prefix == "new_" and row["kind"] == "delete"
    ):
        return None
    return {c: row[prefix + c] for c in columns}


def judge_changes(
    wh: Warehouse,
    watch: Watch,
    source: SourceBase,
    passed: pl.DataFrame,
    judge: AnyJudge,
    budget: CallBudget,
    stats: EvaluationStats,
    *,
    day: date,
) -> dict[int, _Decision]:
    """Verdicts for the changes that passed the filter: cached ones first, then the model.

    Calls are taken from ``budget``; what they spent is added to ``day``'s at the end, and
    each prompt sent is kept for `changewatch explain` (evaluators/judge_prompts.py).
    """
    config = watch.judge
    assert config is not None
    version = judge_version(config)
    hashes = passed.select(
        pl.coalesce("new_hash", pl.lit("deleted:") + pl.col("old_hash")).alias("content_hash")
    ).unique()
    wh.stage("cw_judge_keys", hashes)
    try:
        cached = wh.fetch_frame(
            render("select_judge_cache_staged", wh.dialect, stage=quote("cw_judge_keys")),
            (watch.name, version, judge.model_id),
        )
    finally:
        wh.unstage("cw_judge_keys")
    cache = {row["content_hash"]: row for row in cached.iter_rows(named=True)}
    columns = list(source.columns)
    decisions: dict[int, _Decision] = {}
    judged_now: dict[str, _Decision] = {}  # identical content in one run is judged once
    unavailable = {"hold": "held", "notify": "notify", "drop": "dropped"}[config.on_unavailable]
    failures_in_a_row, last_error = 0, None
    calls, spent = 0, (stats.prompt_tokens, stats.completion_tokens)
    for row in passed.iter_rows(named=True):
        content = _content_hash(row)
        if content in cache:
            hit = cache[content]
            verdict = Verdict(
                reasoning=hit["reasoning"],
                should_notify=hit["should_notify"],
                urgency=hit["urgency"],
                summary=hit["summary"],
                confidence=hit["confidence"],
            )
            decisions[row["change_id"]] = _Decision(
                _verdict_decision(verdict, config.min_confidence), verdict, cache_hit=True
            )
            stats.judge_cache_hits += 1
            continue
        if content in judged_now:
            decisions[row["change_id"]] = judged_now[content]
            continue
        if budget.left <= 0:
            # Over the per-run cap or the day's budget: wait for a later run rather than
            # decide unjudged.
            decisions[row["change_id"]] = _Decision("held", error=budget.exhausted)
            if budget.daily is not None:
                stats.daily_budget = budget.daily
                stats.held_for_budget += 1
            continue
        if failures_in_a_row >= _BREAKER:
            # The judge is down: stop spending time on calls that will fail the same way.
            decisions[row["change_id"]] = _Decision(unavailable, error=last_error)
            continue
        budget.left -= 1
        calls += 1
        outcome = judge.evaluate(
            ChangeForJudge(
                watch=watch.name,
                source=source.name,
                kind=row["kind"],
                object_key=row["object_key"],
                old=_values(row, "old_", columns),
                new=_values(row, "new_", columns),
                changed_columns=row["changed_columns"],
                url=_render(watch.url, _context(watch, source, row, None)) or None,
            )
        )
        stats.judge_requests += outcome.attempts
        stats.prompt_tokens += outcome.prompt_tokens
        stats.completion_tokens += outcome.completion_tokens
        save_prompt(wh, watch.name, content, outcome)
        if outcome.verdict is None:
            stats.judge_errors += 1
            if outcome.fault == "server":  # a change's own problem says nothing of the next
                failures_in_a_row += 1
                last_error = outcome.error
            stats.judge_unavailable = (
                f"unreachable at {judge.url}"
                if outcome.unreachable
                else f"unavailable at {judge.url} ({outcome.error})"
            )
            decision = _Decision(unavailable, outcome=outcome, error=outcome.error)
        else:
            stats.judged += 1
            failures_in_a_row = 0
            _save_verdict(wh, watch, content, outcome)
            decision = _Decision(
                _verdict_decision(outcome.verdict, config.min_confidence),
                outcome.verdict,
                outcome=outcome,
            )
        judged_now[content] = decision
        decisions[row["change_id"]] = decision
    stats.judge_calls += calls
    record_spend(
        wh,
        watch.name,
        day,
        calls,
        stats.prompt_tokens - spent[0],
        stats.completion_tokens - spent[1],
    )
    return decisions


def _verdict_decision(verdict: Verdict, min_confidence: float) -> str:
    return "notify" if verdict.should_notify and verdict.confidence >= min_confidence else "skip"


def _save_verdict(wh: Warehouse, watch: Watch, content: str, outcome: JudgeOutcome) -> None:
    """Store a verdict at once, in its own transaction: a crash later must not cost a call."""
    verdict = outcome.verdict
    assert verdict is not None
    with wh.transaction():
        wh.execute(
            render("insert_judge_cache", wh.dialect),
            (
                watch.name,
                content,
                outcome.judge_version,
                outcome.model,
                verdict.should_notify,
                verdict.urgency,
                verdict.summary,
                verdict.reasoning,
                verdict.confidence,
                outcome.prompt_tokens,
                outcome.completion_tokens,
                outcome.latency_ms,
                datetime.now(UTC),
            ),
        )


def _context(
    watch: Watch, source: SourceBase, row: Mapping[str, Any], verdict: Verdict | None
) -> dict[str, Any]:
    columns = list(source.columns)
    old, new = _values(row, "old_", columns), _values(row, "new_", columns)
    changed = row["changed_columns"] or []
    summary = (
        verdict.summary
        if verdict
        else (
            f"{row['kind']} of {source.name} {row['object_key']}"
            + (f": {', '.join(changed)} changed" if changed else "")
        )
    )
    return {
        "watch": watch.name,
        "source": source.name,
        "kind": row["kind"],
        "key": row["object_key"],
        "change_id": row["change_id"],
        "old": old or {},
        "new": new or {},
        "current": new or old or {},
        "changed": changed,
        "summary": summary,
        "urgency": verdict.urgency if verdict else "normal",
        "reasoning": verdict.reasoning if verdict else "",
    }


@lru_cache(maxsize=256)
def _compiled(template: str) -> Template:
    """``template`` compiled once per text: compiling costs a hundred times a render."""
    return _TEMPLATES.from_string(template)


def _render(template: str, context: Mapping[str, Any]) -> str:
    return _compiled(template).render(**context).strip()


def _render_all(template: str, contexts: list[dict[str, Any]]) -> list[str]:
    """``template`` rendered for each of ``contexts``, as ``_render`` would, in one pass.

    One render of a loop over all contexts costs a fifth of a render per context. Outputs are
    split at a random separator; should an output contain it, the counts disagree and each
    is rendered on its own instead.
    """
    looped = _looped(template)
    if looped is not None and contexts:
        separator = f"\x00{uuid.uuid4().hex}\x00"
        parts = looped.render(cw_rows=contexts, cw_separator=separator).split(separator)
        if len(parts) == len(contexts) + 1:
            return [part.strip() for part in parts[:-1]]
    return [_render(template, context) for context in contexts]


# The names _context gives every template.
_CONTEXT_NAMES = frozenset(
    ("watch", "source", "kind", "key", "change_id", "old", "new", "current", "changed")
    + ("summary", "urgency", "reasoning")
)


@lru_cache(maxsize=256)
def _looped(template: str) -> Template | None:
    """``template`` inside a loop over ``cw_rows``, each output followed by ``cw_separator``.

    None when the loop could change what it renders: a name other than the context's and
    the globals (``loop``, say, or a typo that renders empty alone) is rendered one by one.
    """
    used = meta.find_undeclared_variables(_TEMPLATES.parse(template)) - set(_TEMPLATES.globals)
    if not used <= _CONTEXT_NAMES:
        return None
    # Each output in its own scope, with exactly the names it would see alone.
    names = ", ".join(f"{name}=cw_row[{name!r}]" for name in sorted(used))
    try:
        return _TEMPLATES.from_string(
            f"{{% for cw_row in cw_rows %}}{{% with {names} %}}{template}{{% endwith %}}"
            "{{ cw_separator }}{% endfor %}"
        )
    except TemplateSyntaxError:
        return None


def _decide(
    watch: Watch,
    source: SourceBase,
    changes: pl.DataFrame,
    verdicts: Mapping[int, _Decision],
    version: str,
    evaluated_at: datetime,
    *,
    model: str | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Evaluation rows for every change, and the notifications of those that notify.

    Changes the filter rejected are settled column-wise; only the survivors (few, and each
    possibly judged) are handled one by one.
    """
    rejected = changes.filter(~pl.col("_passed")).select(
        pl.lit(watch.name).alias("watch"),
        pl.lit(source.name).alias("source"),
        "change_id",
        "object_key",
        "kind",
        pl.coalesce("new_hash", "old_hash").alias("content_hash"),
        pl.lit(False).alias("passed_filter"),
        pl.when(pl.col("_filter_error").is_null())
        .then(pl.lit("skip"))
        .otherwise(pl.lit("filter_error"))
        .alias("decision"),
        pl.col("_filter_error").alias("filter_error"),
        pl.lit(evaluated_at).alias("evaluated_at"),
    )
    rows, notifications, contexts = [], [], []
    judge = watch.judge
    # Debounce: a notification waits until its change is this old (see evaluators/debounce.py).
    debounce = timedelta(seconds=watch.debounce) if watch.debounce else None
    judged_by = judge_version(judge) if judge else None  # a hash: worked out once, not per row
    for row in changes.filter(pl.col("_passed")).iter_rows(named=True):
        judged = verdicts[row["change_id"]] if judge else _Decision("notify")
        verdict, outcome = judged.verdict, judged.outcome
        record: dict[str, Any] = {
            "watch": watch.name,
            "source": source.name,
            "change_id": row["change_id"],
            "object_key": row["object_key"],
            "kind": row["kind"],
            "content_hash": row["new_hash"] or row["old_hash"],
            "passed_filter": True,
            "decision": judged.decision,
            "should_notify": verdict.should_notify if verdict else None,
            "urgency": verdict.urgency if verdict else None,
            "summary": verdict.summary if verdict else None,
            "reasoning": verdict.reasoning if verdict else None,
            "confidence": verdict.confidence if verdict else None,
            # The judge's identity (a local model's file and hash), else the configured name.
            "model": (model or judge.model) if judge else None,
            "judge_version": judged_by,
            "judge_error": judged.error,
            "filter_error": None,
            "cache_hit": judged.cache_hit if judge else None,
            "prompt_tokens": outcome.prompt_tokens if outcome else None,
            "completion_tokens": outcome.completion_tokens if outcome else None,
            "latency_ms": outcome.latency_ms if outcome else None,
            "notification_id": None,
            "evaluated_at": evaluated_at,
        }
        if judged.decision == "notify":
            context = _context(watch, source, row, verdict)
            key = dedupe_key(
                watch, source.name, row["object_key"], row["old_hash"], row["new_hash"], version
            )
            record["notification_id"] = notification_id_for(key)
            notifications.append(
                {
                    "notification_id": record["notification_id"],
                    "dedupe_key": key,
                    "watch": watch.name,
                    "source": source.name,
                    "object_key": row["object_key"],
                    "kind": row["kind"],
                    "change_id": row["change_id"],
                    "urgency": context["urgency"],
                    "summary": context["summary"],
                    "payload": json.dumps(
                        {
                            "changed": context["changed"],
                            "old": context["old"],
                            "new": context["new"],
                        },
                        default=str,
                        sort_keys=True,
                    ),
                    "created_at": evaluated_at,
                    "due_at": row["detected_at"] + debounce if debounce else None,
                    # Carried in every payload with change_id, so a receiver can drop a
                    # notification older than one it already has (channels/base.py).
                    "changed_at": row["detected_at"],
                }
            )
            contexts.append(context)
        rows.append(record)
    # Each template over all the notifications at once (see _render_all).
    titles, bodies, urls = (_render_all(t, contexts) for t in (watch.title, watch.body, watch.url))
    for notification, title, body, url in zip(notifications, titles, bodies, urls, strict=True):
        notification.update(title=title, body=body, url=url or None)
    evaluations = pl.concat(
        [
            pl.DataFrame(rows, schema=_EVALUATION_SCHEMA),
            rejected.with_columns(pl.col("evaluated_at").cast(pl.Datetime("us", "UTC"))),
        ],
        how="diagonal_relaxed",
    ).select(list(_EVALUATION_SCHEMA))
    # Changes sharing a key in one run: the first one says it, as it would in runs of its own;
    # with debounce the latest, as a later run would revive it for the latest (see _commit).
    outbox = pl.DataFrame(notifications, schema=_OUTBOX_SCHEMA).unique(
        "notification_id", keep="last" if debounce else "first", maintain_order=True
    )
    return evaluations, outbox


_EVALUATION_SCHEMA = {
    "watch": pl.String,
    "source": pl.String,
    "change_id": pl.Int64,
    "object_key": pl.String,
    "kind": pl.String,
    "content_hash": pl.String,
    "passed_filter": pl.Boolean,
    "decision": pl.String,
    "should_notify": pl.Boolean,
    "urgency": pl.String,
    "summary": pl.String,
    "reasoning": pl.String,
    "confidence": pl.Float64,
    "model": pl.String,
    "judge_version": pl.String,
    "judge_error": pl.String,
    "filter_error": pl.String,
    "cache_hit": pl.Boolean,
    "prompt_tokens": pl.Int32,
    "completion_tokens": pl.Int32,
    "latency_ms": pl.Int32,
    "notification_id": pl.String,
    "evaluated_at": pl.Datetime("us", "UTC"),
}
_OUTBOX_SCHEMA = {
    "notification_id": pl.String,
    "dedupe_key": pl.String,
    "watch": pl.String,
    "source": pl.String,
    "object_key": pl.String,
    "kind": pl.String,
    "change_id": pl.Int64,
    "title": pl.String,
    "body": pl.String,
    "url": pl.String,
    "urgency": pl.String,
    "summary": pl.String,
    "payload": pl.String,
    "created_at": pl.Datetime("us", "UTC"),
    "due_at": pl.Datetime("us", "UTC"),
    "changed_at": pl.Datetime("us", "UTC"),
}


def _commit(
    wh: Warehouse,
    watch: Watch,
    source: SourceBase,
    changes: pl.DataFrame,
    evaluations: pl.DataFrame,
    outbox: pl.DataFrame,
    version: str,
    evaluated_at: datetime,
    stats: EvaluationStats,
) -> None:
    """Evaluations, notifications, deliveries and the watermark: one transaction."""
    with wh.transaction():
        # Evaluations of one watch never interleave (the outbox key would keep them correct,
        # but the counts of notified and suppressed would not be).
        wh.lock(f"changewatch:evaluate:{watch.name}")
        existing: set[str] = set()
        if outbox.height:
            with wh.staged("cw_outbox", outbox) as stage:
                existing = set(
                    wh.fetch_frame(render("select_outbox_existing_staged", wh.dialect, stage=stage))
                    .get_column("notification_id")
                    .to_list()
                )
                wh.execute(render("insert_outbox_staged", wh.dialect, stage=stage))
                if watch.debounce and existing:
                    existing -= _revive(wh, stage)
            fresh = outbox.filter(~pl.col("notification_id").is_in(list(existing)))
            deliveries = fresh.select(
                "notification_id",
                pl.when(pl.col("due_at").is_null())
                .then(pl.lit("pending"))
                .otherwise(pl.lit("debounced"))
                .alias("status"),
                pl.coalesce("due_at", "created_at").alias("next_attempt_at"),
            ).join(
                pl.DataFrame({"channel": watch.channels}, schema={"channel": pl.String}),
                how="cross",
            )
            if deliveries.height:
                with wh.staged("cw_deliveries", deliveries) as stage:
                    wh.execute(render("insert_deliveries_staged", wh.dialect, stage=stage))
            stats.notified += fresh.height
            stats.suppressed_duplicates += outbox.height - fresh.height
        evaluations = evaluations.with_columns(
            pl.when(pl.col("notification_id").is_in(list(existing)))
            .then(pl.lit("duplicate"))
            .otherwise(pl.col("decision"))
            .alias("decision")
        )
        stats.held += evaluations.filter(pl.col("decision") == "held").height
        stats.dropped += evaluations.filter(pl.col("decision") == "dropped").height
        stats.filter_errors += evaluations.filter(pl.col("decision") == "filter_error").height
        with wh.staged("cw_evaluations", evaluations) as stage:
            wh.execute(render("upsert_evaluations_staged", wh.dialect, stage=stage))
        wh.execute(
            render("upsert_watch_state", wh.dialect),
            (watch.name, source.name, changes.get_column("change_id").max(), version, evaluated_at),
        )


def _revive(wh: Warehouse, stage: str) -> set[str]:
    """Debounced notifications of ``stage`` that a later change takes over; their ids.

    The same key again, from a later change, while nothing of the notification was sent
    (waiting, or suppressed as a flap): it now stands for that change and waits anew, so the
    burst is decided on its latest change rather than lost as a duplicate.
    """
    revived = {
        row[0] for row in wh.fetch(render("update_outbox_revive_staged", wh.dialect, stage=stage))
    }
    if revived:
        wh.execute(render("update_deliveries_revive_staged", wh.dialect, stage=stage))
    return revived
