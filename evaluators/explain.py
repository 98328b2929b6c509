"""Why a watch did or did not tell anyone about an object: every change, every decision.

Reads the ``decisions`` view (evaluations joined with the outbox and deliveries) next to the
object's change log, so the answer is the stored record, never a re-run of filter or judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl
from changewatch.evaluators.change_logs import has_change_log
from changewatch.evaluators.config import Watch
from changewatch.evaluators.judge_prompts import format_prompt, object_prompts
from changewatch.evaluators.local_model import SMOKE_TEST_MARK
from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import changes_table, ensure_evaluation_tables
from changewatch.warehouse.statements import quote, render

__all__ = ["explain_object", "format_explanation"]


def explain_object(
    wh: Warehouse, watch: Watch, sources: Mapping[str, SourceBase], key: str
) -> pl.DataFrame:
    """One row per (change of ``key``, delivery channel) over the watch's sources.

    Columns: ``source``, ``watermark`` (the watch's last evaluated change there), those of
    ``sql/select_object_changes.sql`` and the prompt the judge was sent about the change
    (``content_hash``, ``system_prompt``, ``user_prompt``; null when none was).
    """
    with wh.transaction():
        ensure_evaluation_tables(wh)
    frames = []
    for name in watch.sources:
        source = sources[name]
        if not has_change_log(wh, source):
            continue  # never synced: no change of it to explain
        state = wh.fetch(render("select_watch_state", wh.dialect), (watch.name, name))
        statement = render(
            "select_object_changes", wh.dialect, changes=quote(changes_table(source.table))
        )
        frame = wh.fetch_frame(statement, (watch.name, name, key))
        prompts = object_prompts(wh, watch.name, name, key).select(
            "change_id", "content_hash", "system_prompt", "user_prompt"
        )
        frames.append(
            frame.join(prompts, on="change_id", how="left").with_columns(
                pl.lit(name).alias("source"),
                pl.lit(state[0][0] if state else None, pl.Int64).alias("watermark"),
            )
        )
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _verdict(row: Mapping[str, Any]) -> str:
    cached = "cached" if row["cache_hit"] else "fresh call"
    # The bundled local model's verdicts are a smoke test's, not judgements: said up front.
    smoke = "[smoke test] " if (row.get("summary") or "").startswith(SMOKE_TEST_MARK) else ""
    return (
        f"{smoke}judge ({row['model']}, {cached}): "
        f"{'notify' if row['should_notify'] else 'no'}, confidence {row['confidence']:.2f}: "
        f"{row['reasoning']}"
    )


def _decision(watch: Watch, row: Mapping[str, Any]) -> list[str]:
    """What happened to one change, a line per step it went through."""
    decision = row["decision"]
    if decision is None:
        if row["silent"]:
            return ["recorded silently (a baseline or a --silent backfill): never evaluated"]
        if row["held"]:
            return ["held after a change storm: waits for `changewatch release`"]
        if row["watermark"] is None or row["change_id"] > row["watermark"]:
            return ["not evaluated yet: the watch's next run will"]
        return ["not evaluated: before the watch started, or its record was pruned"]
    if decision == "filter_error":
        return [f"filter failed on this change's values (retried every run): {row['filter_error']}"]
    if not row["passed_filter"]:
        return [f"did not match the filter: where {watch.where}"]
    lines = [f"filter passed: where {watch.where}"]
    if row["should_notify"] is not None:
        lines.append(_verdict(row))
    if decision == "skip":
        lines.append(f"not notified: {_why_skipped(watch, row)}")
    elif decision in ("held", "dropped"):
        action = "held, retried next run" if decision == "held" else "dropped (on_unavailable)"
        # Evaluations before issue 17 stored some reasons with this prefix already.
        reason = (row["judge_error"] or "no reason recorded").removeprefix("judge unavailable: ")
        lines.append(f"not judged: {reason}; {action}")
    elif decision == "duplicate":
        lines.append(
            f"suppressed as a duplicate of notification {row['notification_id']} "
            f"(dedupe key {row['dedupe_key']})"
        )
    else:
        lines.append(f"notified: {row['notification_id']} (dedupe key {row['dedupe_key']})")
        lines += _debounce(row)
    return lines


def _why_skipped(watch: Watch, row: Mapping[str, Any]) -> str:
    """The one cause of a judged change's skip: the judge's no, or its notify below the
    watch's ``min_confidence``."""
    if not row["should_notify"]:
        return "the judge said no"
    least = watch.judge.min_confidence if watch.judge is not None else None
    if least is not None and row["confidence"] is not None and row["confidence"] < least:
        return (
            f"the judge said notify at confidence {row['confidence']:.2f}, below the watch's "
            f"min_confidence {least:.2f}"
        )
    return "the judge said notify, but below the min_confidence in force when it was judged"


def _debounce(row: Mapping[str, Any]) -> list[str]:
    """What the watch's debounce made of a notification: waiting, suppressed, taken over."""
    if row["debounced_until"] is None:
        return []
    if row["notified_change_id"] != row["change_id"]:
        return [
            f"taken over by change {row['notified_change_id']} (same key, within the "
            "debounce): that change's notification speaks for both"
        ]
    if row["suppressed"]:
        return [f"suppressed (debounce): {row['suppressed']}"]
    if row["delivery_status"] == "debounced":
        return [f"debounced: waits until {row['debounced_until']} to see if it stays"]
    return [f"debounce ended {row['debounced_until']}: it stayed, released"]


def format_explanation(watch: Watch, key: str, frame: pl.DataFrame) -> str:
    """The story of ``key`` for ``watch``: each change, then what was decided and sent."""
    if frame.is_empty():
        return f"{watch.name}: no change of {key!r} in {', '.join(watch.sources)}"
    out = [f"{watch.name}: object {key}"]
    system = None  # the system prompt shown last: the same one again is not repeated
    for (source, change_id), group in frame.group_by(["source", "change_id"], maintain_order=True):
        row = group.row(0, named=True)
        changed = ", ".join(row["changed_columns"] or [])
        out.append(
            f"- {source} change {change_id}: {row['kind']} at {row['detected_at']}"
            + (f" ({changed} changed)" if changed else "")
        )
        out += [f"    {line}" for line in _decision(watch, row)]
        # A debounced notification a later change took over: its deliveries are that change's.
        taken_over = row["debounced_until"] is not None and row["notified_change_id"] != change_id
        if row["decision"] == "notify" and not taken_over:
            for delivery in group.filter(pl.col("channel").is_not_null()).iter_rows(named=True):
                error = f": {delivery['last_error']}" if delivery["last_error"] else ""
                out.append(
                    f"    delivery to {delivery['channel']}: {delivery['delivery_status']} "
                    f"after {delivery['attempts']} attempt(s){error}"
                )
        if row["user_prompt"] is not None:  # last: the longest part of a change's story
            shown = format_prompt(watch.name, row, same_system=row["system_prompt"] == system)
            out += [f"    {line}" if line else "" for line in shown]
            system = row["system_prompt"]
    return "\n".join(out)
