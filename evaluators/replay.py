"""Replay a watch over stored history with an edited filter or condition, sending nothing.

For each recorded change since a time, the replay asks the edited filter (in the warehouse)
and, for the survivors, the judge (through the same verdict cache as evaluation, so content
judged before under that condition costs no call), and compares what it would notify with
what the watch notified then. The comparison is stored in ``replays`` and returned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
from changewatch.evaluators.cascade import AnyJudge, cascade_label
from changewatch.evaluators.change_logs import has_change_log
from changewatch.evaluators.config import Watch
from changewatch.evaluators.evaluate import EvaluationStats, dedupe_key, judge_changes
from changewatch.evaluators.filters import compile_filter
from changewatch.evaluators.judge_budget import open_budget
from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import changes_table, ensure_evaluation_tables
from changewatch.warehouse.statements import quote, render

__all__ = ["ReplayResult", "format_replay", "replay_watch", "replayed"]


def replayed(watch: Watch, *, where: str | None = None, condition: str | None = None) -> Watch:
    """``watch`` with its filter and/or judge condition replaced."""
    update: dict = {}
    if where is not None:
        update["where"] = where
    if condition is not None:
        if watch.judge is None:
            raise ValueError(f"watch {watch.name!r} has no judge: --condition needs one")
        update["judge"] = watch.judge.model_copy(update={"condition": condition})
    return watch.model_copy(update=update)


@dataclass
class ReplayResult:
    """One row per replayed change (``changes``), the replay's version and what it cost."""

    version: str
    changes: pl.DataFrame
    stats: EvaluationStats

    def count(self, outcome: str) -> int:
        return self.changes.filter(pl.col("outcome") == outcome).height


def _version(watch: Watch) -> str:
    # A cascade's models in order; a single judge's model alone (its versions stay as they were).
    judged = f"{watch.judge.condition}\x00{cascade_label(watch.judge)}" if watch.judge else ""
    return hashlib.sha256(f"{watch.where}\x00{judged}".encode()).hexdigest()[:12]


def replay_watch(
    wh: Warehouse,
    watch: Watch,
    sources: Mapping[str, SourceBase],
    *,
    since: datetime,
    judge: AnyJudge | None = None,
) -> ReplayResult:
    """Replay ``watch`` (already edited, see ``replayed``) over changes since ``since``."""
    with wh.transaction():
        ensure_evaluation_tables(wh)
        wh.execute(render("create_replays", wh.dialect))
    stats = EvaluationStats(watch=watch.name)
    version, now = _version(watch), datetime.now(UTC)
    # A replay's calls cost what an evaluation's do: they count against the same day's budget.
    budget = open_budget(wh, watch.name, watch.judge, now.date()) if watch.judge else None
    frames = []
    for name in watch.sources:
        source = sources[name]
        if not has_change_log(wh, source):
            continue  # never synced: no history to replay
        compiled = compile_filter(
            watch.where,
            watch=watch.name,
            columns={c: spec.type for c, spec in source.columns.items()},
        )
        changes = wh.fetch_frame(
            render(
                "select_replay_changes",
                wh.dialect,
                changes=quote(changes_table(source.table)),
                filter=compiled.to_sql(wh.dialect, alias="c"),  # type: ignore[arg-type]
            ),
            (since, watch.name, name),
        )
        stats.changes_read += changes.height
        if changes.is_empty():
            continue
        passed = changes.filter(pl.col("_passed"))
        stats.passed_filter += passed.height
        decisions: dict[int, str] = {}
        if watch.judge is not None and passed.height:
            assert judge is not None and budget is not None, f"watch {watch.name!r} needs a judge"
            verdicts = judge_changes(
                wh, watch, source, passed, judge, budget, stats, day=now.date()
            )
            decisions = {change_id: v.decision for change_id, v in verdicts.items()}
        frames.append(_compare(watch, name, changes, decisions, version, now))
    result = pl.concat(frames) if frames else pl.DataFrame(schema=_SCHEMA)
    if result.height:
        with wh.transaction(), wh.staged("cw_replays", result) as stage:
            wh.execute(render("upsert_replays_staged", wh.dialect, stage=stage))
    return ReplayResult(version, result, stats)


_SCHEMA = {
    "replay_version": pl.String,
    "watch": pl.String,
    "source": pl.String,
    "change_id": pl.Int64,
    "object_key": pl.String,
    "kind": pl.String,
    "sent": pl.Boolean,
    "would_send": pl.Boolean,
    "outcome": pl.String,
    "reason": pl.String,
    "where_text": pl.String,
    "condition_text": pl.String,
    "replayed_at": pl.Datetime("us", "UTC"),
}


def _compare(
    watch: Watch,
    source: str,
    changes: pl.DataFrame,
    decisions: Mapping[int, str],
    version: str,
    now: datetime,
) -> pl.DataFrame:
    """Per change: sent then, would send now, and the outcome of the two."""
    judged = watch.judge is not None
    first_of: dict[str, int] = {}  # dedupe key -> the change that notifies it in the replay
    rows = []
    for row in changes.iter_rows(named=True):
        change_id, passed = row["change_id"], row["_passed"]
        if not passed:
            would, reason = False, "did not match the filter"
        elif not judged:
            would, reason = True, "filter passed"
        else:
            decision = decisions.get(change_id)
            if decision in ("notify", "skip"):
                would = decision == "notify"
                reason = "judge: notify" if would else "judge: no"
            else:  # held or dropped: the judge gave no answer; nothing to compare
                would, reason = None, "judge gave no answer (unavailable, or its call cap)"
        duplicate = False
        if would:
            # Within the replay, a dedupe key notifies once, as it would have then.
            key = dedupe_key(
                watch, source, row["object_key"], row["old_hash"], row["new_hash"], version
            )
            if key in first_of:
                would, duplicate = False, True
                reason = f"duplicate of change {first_of[key]} (same dedupe key)"
            first_of.setdefault(key, change_id)
        # The replay compares decisions; a notification the watch's debounce then suppressed
        # was decided "notify" but never sent, and the table says so.
        sent = row["_actual"] == "notify" and not row["_suppressed"]
        # A duplicate then was suppressed because its key had notified already: replaying
        # it as "would send" is no change.
        notified_then = row["_actual"] in ("notify", "duplicate")
        if would is None:
            outcome = "undecided"
        elif duplicate:
            # Its key notifies all the same (with an earlier change): nothing is dropped.
            outcome = "same" if row["_actual"] == "duplicate" else "duplicate"
        elif would == notified_then:
            outcome = "same"
        else:
            outcome = "added" if would else "dropped"
        rows.append(
            {
                "replay_version": version,
                "watch": watch.name,
                "source": source,
                "change_id": change_id,
                "object_key": row["object_key"],
                "kind": row["kind"],
                "sent": sent,
                "would_send": would,
                "outcome": outcome,
                "reason": reason,
                "where_text": watch.where,
                "condition_text": watch.judge.condition if watch.judge else None,
                "replayed_at": now,
            }
        )
    return pl.DataFrame(rows, schema=_SCHEMA)


def format_replay(watch: Watch, since: datetime, result: ReplayResult) -> str:
    """A summary line, then one line per change whose outcome differs: + added, - dropped,
    = a duplicate (sent then, now suppressed because an earlier change notifies its key)."""
    s = result.stats
    undecided = result.count("undecided")
    why = ""
    if undecided:  # the judge gave these no answer: say why, or the count means nothing
        if s.judge_unavailable:
            why = f" (judge {s.judge_unavailable})"
        elif s.daily_budget is not None:
            why = f" (daily budget of {s.daily_budget} calls reached, replays included)"
        else:
            why = (
                " (the judge's call cap was reached: judge.max_calls_per_run is "
                f"{watch.judge.max_calls_per_run if watch.judge else 0})"
            )
    duplicates = result.count("duplicate")
    lines = [
        f"replay {result.version} of {watch.name} since {since:%Y-%m-%d %H:%M} UTC: "
        f"{s.changes_read} change(s), {s.passed_filter} passed the filter, {s.judged} judged "
        f"({s.judge_cache_hits} cached); {result.count('added')} added, "
        f"{result.count('dropped')} dropped, "
        + (f"{duplicates} duplicate(s), " if duplicates else "")
        + f"{result.count('same')} unchanged, {undecided} undecided{why}; nothing was sent"
    ]
    signs = {"added": "+", "dropped": "-", "duplicate": "="}
    differ = result.changes.filter(pl.col("outcome").is_in(list(signs)))
    for row in differ.iter_rows(named=True):
        sign = signs[row["outcome"]]
        lines.append(
            f"{sign} {row['source']} {row['object_key']} (change {row['change_id']}, "
            f"{row['kind']}): {row['reason']}"
        )
    lines.append(f"(all rows: SELECT * FROM replays WHERE replay_version = '{result.version}')")
    return "\n".join(lines)
