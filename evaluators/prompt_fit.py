"""Fitting a change to the judge model's context: the longest values are cut first.

A change's values can be any size (a 50 KB issue body); the model's context cannot. Sent
whole, such a change fails on every run ("Requested tokens exceed context window"), so before
it is sent (evaluators/judge.py) its prompt is measured: with the model's own tokenizer for
the local model, else a conservative estimate (``estimate_tokens``). When the system prompt,
the change's prompt and the longest answer asked for (``max_tokens``) would not fit
``judge.context_tokens``, every value longer than some length is cut to that length, the
longest length that fits, so the longest values lose the most and short ones (state, labels)
nothing. The verdict's reasoning then starts with a note naming what was cut.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # judge.py uses this module: imported at run time, it would be circular
    from changewatch.evaluators.config import JudgeConfig
    from changewatch.evaluators.judge import ChangeForJudge

__all__ = [
    "DEFAULT_CONTEXT",
    "Fitted",
    "PromptTooLong",
    "estimate_tokens",
    "fit_change",
    "token_counter",
]

# The context assumed of a model other than the local one when `judge.context_tokens` is unset.
DEFAULT_CONTEXT = 8192
# Characters per token assumed for ASCII text by the estimate: tokenizers of current models
# average 3.5-4.5 on English and about 3 on JSON and code, so 3 rarely undercounts.
_ASCII_CHARS_PER_TOKEN = 3
# What follows a cut value in the prompt.
_MARK = "…[cut]"

Count = Callable[[str], int]


class PromptTooLong(ValueError):
    """Even with every value cut, the change's prompt does not fit the model's context."""


@dataclass(frozen=True)
class Fitted:
    """A change as it fits the context, and what was cut to make it fit (None: nothing)."""

    change: ChangeForJudge
    note: str | None = None


def estimate_tokens(text: str) -> int:
    """A conservative token count: 3 ASCII characters a token, each other character one
    (CJK, emoji and accented text take a token or more per character in most vocabularies).

    >>> estimate_tokens("abcdefg"), estimate_tokens("日本語"), estimate_tokens("")
    (3, 3, 0)
    """
    ascii_chars = len(text.encode("ascii", "ignore"))
    return -(-ascii_chars // _ASCII_CHARS_PER_TOKEN) + (len(text) - ascii_chars)


def token_counter(config: JudgeConfig) -> tuple[int, Count]:
    """The judge model's context size in tokens and how to count a text's tokens: the local
    model's own tokenizer and context, else the estimate and ``context_tokens`` (or 8192)."""
    from changewatch.evaluators.config import LOCAL_MODEL

    if config.model == LOCAL_MODEL:
        from changewatch.evaluators import local_model

        context = min(config.context_tokens or local_model.CONTEXT, local_model.CONTEXT)
        return context, local_model.count_tokens
    return config.context_tokens or DEFAULT_CONTEXT, estimate_tokens


def fit_change(
    change: ChangeForJudge, *, budget: int, count: Count, render: Callable[[ChangeForJudge], str]
) -> Fitted:
    """``change`` with its longest values cut so that ``count(render(change)) <= budget``.

    Raises ``PromptTooLong`` when it does not fit even with every value cut to nothing.

    >>> from changewatch.evaluators.judge import ChangeForJudge
    >>> change = ChangeForJudge("w", "s", "insert", "1", None,
    ...     {"title": "Outage", "body": "x" * 900}, None)
    >>> fitted = fit_change(change, budget=100, count=len, render=lambda c: json.dumps(c.new))
    >>> fitted.change.new["title"], len(fitted.change.new["body"]), fitted.note
    ('Outage', 64, 'new.body cut from 900 to 58 characters')
    >>> fit_change(change, budget=1000, count=len, render=lambda c: json.dumps(c.new)).note
    """
    if count(render(change)) <= budget:
        return Fitted(change)
    texts = {
        (side, column): value if isinstance(value, str) else _json(value)
        for side in ("old", "new")
        for column, value in (getattr(change, side) or {}).items()
    }

    def fits(length: int) -> bool:
        return count(render(_cut(change, texts, length))) <= budget

    if not fits(0):
        raise PromptTooLong("the change does not fit even with every value cut")
    # fits(low) holds and fits(high) does not: the longest length that fits is in between.
    low, high = 0, max(map(len, texts.values()))
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    cut = sorted(
        (
            (len(text), f"{side}.{column}")
            for (side, column), text in texts.items()
            if len(text) > low
        ),
        reverse=True,
    )
    named = [f"{name} cut from {length} to {low} characters" for length, name in cut[:3]]
    more = f" (and {len(cut) - 3} more)" if len(cut) > 3 else ""
    return Fitted(_cut(change, texts, low), "; ".join(named) + more)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _cut(change: ChangeForJudge, texts: dict[tuple[str, str], str], length: int) -> ChangeForJudge:
    """``change`` with each value longer than ``length`` characters (as the prompt shows it)
    cut to its first ``length`` characters and a mark."""
    sides: dict[str, Any] = {}
    for side in ("old", "new"):
        values = getattr(change, side)
        if values is not None:
            sides[side] = {
                column: texts[side, column][:length] + _MARK
                if len(texts[side, column]) > length
                else value
                for column, value in values.items()
            }
    return replace(change, **sides)
