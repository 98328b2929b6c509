"""Caps what is kept of a verdict's text: between the model's answer and everything stored.

A model may answer a million characters of reasoning; the verdict is stored in the judge
cache and in each change's evaluation (and its summary in the notification), so its text is
cut to ``judge.max_reasoning_chars`` / ``judge.max_summary_chars`` first, and says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # judge.py applies the caps: imported at run time, it would be circular
    from changewatch.evaluators.judge import Verdict

__all__ = ["capped", "cut"]


def cut(text: str, limit: int, setting: str) -> str:
    """``text``, or its first characters and a note naming ``setting``, within ``limit``.

    >>> cut("short", 20, "judge.max_summary_chars")
    'short'
    >>> cut("x" * 200, 100, "judge.max_summary_chars")[-57:]
    'x… [cut at 100 characters: raise judge.max_summary_chars]'
    >>> len(cut("x" * 200, 100, "judge.max_summary_chars"))
    100
    """
    if len(text) <= limit:
        return text
    note = f"… [cut at {limit} characters: raise {setting}]"
    return text[: max(0, limit - len(note))] + note


def capped(verdict: Verdict, *, max_reasoning: int, max_summary: int) -> Verdict:
    """``verdict`` with its reasoning and summary cut to the limits (itself if within)."""
    reasoning = cut(verdict.reasoning, max_reasoning, "judge.max_reasoning_chars")
    summary = cut(verdict.summary, max_summary, "judge.max_summary_chars")
    if reasoning is verdict.reasoning and summary is verdict.summary:
        return verdict
    return verdict.model_copy(update={"reasoning": reasoning, "summary": summary})
