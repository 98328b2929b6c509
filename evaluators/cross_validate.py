"""K-fold cross-validation of the learned stage on an examples file (``eval --cross-validate``).

Per examples file: the learned stage alone (its answer at p >= 0.5 on every change), the
share it decides at its threshold with precision and recall there, the cascade (its decisions,
the rest answered by an LLM when one is given, else counted as sent to it), always-notify and
always-skip, and with an LLM the LLM alone (asked about every change once); then a learning
curve: the same with 10, 20, 40 and all training labels. Folds are stratified and seeded, so
a run repeats. Each cascade asks the LLM only about the changes the stage abstained on, once
per curve point (each point is a cascade of its own), and the LLM's time per question is
measured where it is asked, so with a served model the latency includes the wire.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from changewatch.evaluators import learned
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import render_user_prompt

__all__ = ["CURVE", "Row", "cross_validate", "format_rows"]

CURVE = (10, 20, 40)
_SEED = 0

# Asks the LLM about one example; True: notify. None: no LLM, the cascade's rest is unscored.
AskLLM = Callable[[EvalExample], bool] | None


@dataclass(frozen=True)
class Row:
    name: str  # the examples file's name
    stage: str  # learned | cascade | always-notify | always-skip | llm-alone
    labels: int  # training labels per fold
    precision: float | None
    recall: float | None
    f1: float | None
    to_llm: float  # share of changes sent to the LLM
    decided_precision: float | None = None  # on the share the learned stage decided
    decided_recall: float | None = None
    ms: float = 0.0  # latency per change, ms: the learned stage's, plus the LLM's (cascade)
    asked: int = 0  # changes sent to the LLM (the cascade's abstentions; all, for llm-alone)
    llm_ms: float | None = None  # the LLM's time per question asked, ms


def _prf(pred: Sequence[bool], actual: Sequence[bool]) -> tuple[float | None, ...]:
    tp = sum(p and a for p, a in zip(pred, actual, strict=True))
    fp = sum(p and not a for p, a in zip(pred, actual, strict=True))
    fn = sum(a and not p for p, a in zip(pred, actual, strict=True))
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return precision, recall, f1


def cross_validate(
    name: str,
    watch: str,
    examples: Sequence[EvalExample],
    k: int,
    ask: AskLLM = None,
    *,
    condition: str | None = None,
    fit_options: Mapping[str, Any] | None = None,
) -> list[Row]:
    """Rows for ``examples``: constants, then the learned stage and cascade per curve point.
    ``condition``: what they were labelled against (its terms are features); ``fit_options``
    go to learned.fit (to compare its choices side by side)."""
    import numpy as np
    from sklearn.model_selection import StratifiedKFold

    prompts = [render_user_prompt(e.change(watch)) for e in examples]
    y = np.array([e.expect == "notify" for e in examples])
    actual = list(map(bool, y))
    rows = [
        Row(name, "always-notify", 0, *_prf([True] * len(y), actual), to_llm=0.0),
        Row(name, "always-skip", 0, *_prf([False] * len(y), actual), to_llm=0.0),
    ]
    if ask is not None:
        started = time.perf_counter()
        said = [ask(e) for e in examples]
        ms = 1000 * (time.perf_counter() - started) / len(y)
        rows.append(Row(name, "llm-alone", 0, *_prf(said, actual), to_llm=1.0, ms=ms,
                        asked=len(y), llm_ms=ms))
    fewest = int(min(y.sum(), len(y) - y.sum()))
    k = max(2, min(k, fewest))
    folds = list(StratifiedKFold(k, shuffle=True, random_state=_SEED).split(prompts, y))
    most = max(len(train) for train, _ in folds)
    rng = np.random.default_rng(_SEED)
    for size in [s for s in CURVE if s < most] + [most]:
        p = np.full(len(y), 0.5)
        sure = np.zeros(len(y), dtype=bool)
        spent = 0.0
        for train, test in folds:
            if size < len(train):
                train = rng.choice(train, size, replace=False)
            model = learned.fit(
                [prompts[i] for i in train], y[train].tolist(), condition=condition,
                **(fit_options or {}),
            )
            if model is None:
                continue  # cold: abstains on the fold
            started = time.perf_counter()
            p[test] = model.probabilities([prompts[i] for i in test])
            spent += time.perf_counter() - started
            sure[test] = np.maximum(p[test], 1 - p[test]) >= model.threshold
        alone = [bool(x >= 0.5) for x in p]
        decided_p, decided_r, _ = _prf(
            [a for a, s in zip(alone, sure, strict=True) if s],
            [a for a, s in zip(actual, sure, strict=True) if s],
        )
        ms = 1000 * spent / len(y)
        rows.append(Row(name, "learned", size, *_prf(alone, actual), to_llm=0.0, ms=ms))
        asked = int((~sure).sum())
        scores: tuple[float | None, ...] = (None, None, None)
        llm_ms = None
        if ask is not None:
            started = time.perf_counter()
            cascade = [a if s else ask(e) for a, s, e in zip(alone, sure, examples, strict=True)]
            waited = time.perf_counter() - started
            scores = _prf(cascade, actual)
            llm_ms = 1000 * waited / asked if asked else None
            ms += 1000 * waited / len(y)
        rows.append(
            Row(name, "cascade", size, *scores, to_llm=asked / len(y),
                decided_precision=decided_p, decided_recall=decided_r, ms=ms, asked=asked,
                llm_ms=llm_ms)
        )
    return rows


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_rows(rows: Sequence[Row]) -> str:
    """A Markdown table of ``rows``."""
    lines = [
        "| examples | stage | train labels | precision | recall | F1 | sent to LLM "
        "| precision decided | recall decided | ms/change | LLM ms/question |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        llm = "-" if r.llm_ms is None else f"{r.llm_ms:.1f}"
        lines.append(
            f"| {r.name} | {r.stage} | {r.labels or '-'} | {_f(r.precision)} | {_f(r.recall)} "
            f"| {_f(r.f1)} | {r.to_llm:.0%} | {_f(r.decided_precision)} "
            f"| {_f(r.decided_recall)} | {r.ms:.1f} | {llm} |"
        )
    return "\n".join(lines)
