"""How many judge calls a run may make: the per-run cap and the watch's daily budget.

Evaluation (evaluators/evaluate.py) and replay (evaluators/replay.py) both open a budget before
they ask the judge and record what they spent right after: a replay's calls cost the same as
an evaluation's, so they count against the same day (``judge_spend``, UTC days). Beyond the
budget, changes are held, never dropped, and judged once the next day's budget opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from changewatch.evaluators.config import JudgeConfig
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["CallBudget", "open_budget", "record_spend"]


@dataclass
class CallBudget:
    """Judge calls this run may still ask for, and what to say of the changes beyond them."""

    left: int
    exhausted: str  # the reason a change beyond the budget is held with
    # The day's budget (max_calls_per_day) when it, not the per-run cap, is the bound.
    daily: int | None = None


def open_budget(wh: Warehouse, watch: str, judge: JudgeConfig, day: date) -> CallBudget:
    """The tighter of ``judge.max_calls_per_run`` and what is left of ``day``'s budget."""
    per_run = judge.max_calls_per_run
    if judge.max_calls_per_day is None:
        return CallBudget(per_run, "per-run judge call cap reached")
    rows = wh.fetch(render("select_judge_spend", wh.dialect), (watch, day))
    left_today = max(0, judge.max_calls_per_day - (rows[0][0] if rows else 0))
    if left_today < per_run:
        return CallBudget(
            left_today,
            f"daily judge budget of {judge.max_calls_per_day} calls reached",
            daily=judge.max_calls_per_day,
        )
    return CallBudget(per_run, "per-run judge call cap reached")


def record_spend(
    wh: Warehouse, watch: str, day: date, calls: int, prompt_tokens: int, completion_tokens: int
) -> None:
    """Add ``calls`` and their tokens to ``day``'s ``judge_spend``.

    Its own transaction, right after the calls: the budget must count calls whose changes a
    later failure leaves unsettled, since the model was asked all the same.
    """
    if not calls:
        return
    with wh.transaction():
        wh.execute(
            render("upsert_judge_spend", wh.dialect),
            (watch, day, calls, prompt_tokens, completion_tokens),
        )
