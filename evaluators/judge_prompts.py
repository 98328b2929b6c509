"""The prompt each judgement sent, kept so `changewatch explain` can show what the model saw.

Sits beside the verdict cache: evaluation (evaluators/evaluate.py) saves the first request's
messages of every call that sent one (answered or not) in ``judge_prompts``, keyed like
``judge_cache``; explanation (evaluators/explain.py) reads them back per change and shows them
fenced and cut to a readable length.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import polars as pl
from changewatch.evaluators.judge import JudgeOutcome
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["SHOWN_CHARS", "format_prompt", "object_prompts", "save_prompt"]

# How much of each message explain shows: the system prompt's start holds the condition, the
# change is the part that differs between changes. The whole is one SELECT away.
SHOWN_CHARS = {"system": 600, "user": 1500}


def save_prompt(wh: Warehouse, watch: str, content: str, outcome: JudgeOutcome) -> None:
    """Store what ``outcome``'s request sent, in its own transaction (like the verdict)."""
    if outcome.user_prompt is None:
        return  # nothing was sent: the change was refused before (too long to fit)
    with wh.transaction():
        wh.execute(
            render("upsert_judge_prompts", wh.dialect),
            (
                watch,
                content,
                outcome.judge_version,
                outcome.model,
                outcome.system_prompt or "",
                outcome.user_prompt,
                datetime.now(UTC),
            ),
        )


def object_prompts(wh: Warehouse, watch: str, source: str, key: str) -> pl.DataFrame:
    """The prompts sent about ``key``'s evaluated changes: change_id, content_hash,
    system_prompt, user_prompt, sent_at."""
    return wh.fetch_frame(render("select_judge_prompts_object", wh.dialect), (watch, source, key))


def _cut(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, saying how much more there is.

    >>> _cut("abcdef", 4), _cut("abc", 4)
    ('abcd… [2 more characters]', 'abc')
    """
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def format_prompt(watch: str, row: dict[str, Any], *, same_system: bool = False) -> list[str]:
    """Lines showing one stored prompt, fenced (with a fence longer than any backtick run in
    it) and each message cut to ``SHOWN_CHARS``; with ``same_system``, the system prompt is
    said to be the one shown above rather than repeated.

    >>> row = {"content_hash": "h1", "system_prompt": "Be brief.", "user_prompt": "x ``` y"}
    >>> print("\\n".join(format_prompt("w", row)))
    prompt sent (whole: SELECT * FROM judge_prompts WHERE watch = 'w' AND content_hash = 'h1'):
    ````
    [system]
    Be brief.
    [user]
    x ``` y
    ````
    """
    messages = {role: str(row[f"{role}_prompt"] or "") for role in ("system", "user")}
    longest = max(
        (len(run) for text in messages.values() for run in re.findall("`+", text)), default=0
    )
    fence = "`" * max(3, longest + 1)
    lines = [
        f"prompt sent (whole: SELECT * FROM judge_prompts WHERE watch = '{watch}' AND "
        f"content_hash = '{row['content_hash']}'):",
        fence,
    ]
    for role, text in messages.items():
        if role == "system" and same_system:
            lines.append("[system] the same as above")
            continue
        lines.append(f"[{role}]")
        lines += _cut(text, SHOWN_CHARS[role]).splitlines()
    return [*lines, fence]
