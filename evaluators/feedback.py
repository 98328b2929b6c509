"""Feedback on notifications (useful or noise), kept in the warehouse and exported as examples."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Literal

import yaml
from changewatch.evaluators.evals import EvalExample
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import ensure_evaluation_tables
from changewatch.warehouse.statements import render

__all__ = [
    "RATINGS",
    "FeedbackError",
    "UnknownNotification",
    "examples_yaml",
    "export_examples",
    "record_feedback",
]

Rating = Literal["useful", "noise"]
RATINGS: tuple[Rating, ...] = ("useful", "noise")


class FeedbackError(ValueError):
    """Feedback that cannot be recorded: an unknown notification or rating."""


class UnknownNotification(FeedbackError):
    """No notification with that id is in the outbox."""


def _ensure_table(wh: Warehouse) -> None:
    with wh.transaction():
        ensure_evaluation_tables(wh)
        wh.execute(render("create_feedback", wh.dialect))


def record_feedback(
    wh: Warehouse, notification_id: str, rating: str, note: str | None = None
) -> str:
    """Store ``rating`` for a notification (the latest word wins); return its watch."""
    if rating not in RATINGS:
        raise FeedbackError(f"feedback must be one of {', '.join(RATINGS)}, not {rating!r}")
    _ensure_table(wh)
    found = wh.fetch(render("select_outbox_notification", wh.dialect), (notification_id,))
    if not found:
        raise UnknownNotification(f"no notification {notification_id!r} in the outbox")
    with wh.transaction():
        wh.execute(
            render("upsert_feedback", wh.dialect),
            (notification_id, rating, note, datetime.now(UTC)),
        )
    return found[0][0]


def export_examples(wh: Warehouse, watch: str) -> list[EvalExample]:
    """The watch's rated notifications as eval examples: useful -> notify, noise -> skip.

    Each example's change makes the prompt the pipeline sent about it, byte for byte (the
    judge renders values in one key order; tests/evaluators/test_feedback_prompt.py).
    """
    _ensure_table(wh)
    rows = wh.fetch(render("select_feedback_examples", wh.dialect), (watch,))
    examples = []
    for notification_id, source, key, kind, title, url, payload, rating, note in rows:
        shown = json.loads(payload)
        examples.append(
            EvalExample(
                name=f"{title} ({notification_id})" + (f": {note}" if note else ""),
                kind=kind,
                key=key,
                source=source,
                # A notification shows {} for the side an insert or delete lacks.
                old=shown.get("old") or None,
                new=shown.get("new") or None,
                # The change log knows changed columns of updates only; the payload shows []
                # for the others, which the judge would read as "(none)" instead of the
                # pipeline's "(not known)".
                changed_columns=shown.get("changed") if kind == "update" else None,
                url=url,
                expect="notify" if rating == "useful" else "skip",
            )
        )
    return examples


def examples_yaml(watch: str, examples: list[EvalExample]) -> str:
    """An examples file (``evals/<watch>.yaml``) holding ``examples``."""
    data = {
        "watch": watch,
        "examples": [e.model_dump(mode="json", exclude_none=True) for e in examples],
    }
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
