"""Choosing the learned stage's classifier and threshold from its own training labels.

Part of fitting (evaluators/learned.py's ``fit``), before the final model is trained on all
labels. Two choices, each made on out-of-fold probabilities of the training labels alone:

- **which features**: the change's numbers (the numeric diffs of learned_features,
  standardized on the training labels), its fields (learned_structure: kind, changed columns,
  short values and their transitions, condition terms, with the numbers), its new text's
  character n-grams (learned_structure), its text's embedding, or embedding and numbers. At
  forty labels the 384 embedding dimensions drown a few numeric ones when both are given to
  one model, so each family is a model of its own and the one with the best out-of-fold Brier
  score is kept (issue 33: on price watches the numbers carry the signal; on incident,
  status-page and release watches the embedding alone did not separate forty changes);
- **where it decides**: the lowest threshold whose decisions keep precision, recall and
  accuracy at the target on the pooled out-of-fold labels *and on every fold alone*, from at
  least ``MIN_DECIDED`` decisions. One lucky fold cannot carry the threshold, so the stage
  decides less at a few labels and more as labels grow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BLOCKS",
    "FAMILIES",
    "MIN_DECIDED",
    "MIN_DECIDING_LABELS",
    "Choice",
    "choose",
    "choose_threshold",
    "classifier",
    "family_features",
    "usable",
]

# Feature families, simplest first: a tie in score keeps the earlier one. Each is the blocks
# it joins (learned.py builds the blocks: text, numbers, fields, ngrams).
BLOCKS = {
    "numbers": ("numbers",),
    "fields": ("fields", "numbers"),
    "ngrams": ("ngrams",),
    "text": ("text",),
    "both": ("text", "numbers"),
}
FAMILIES = tuple(BLOCKS)
# Out-of-fold decisions a threshold must rest on (fewer: it decides nothing): as many as the
# cold start asks labels (learned.MIN_LABELS). At 5, ten labels let it decide a fifth of
# releases.yaml at precision 0.80 (bench/bench_learned.py); at 10 it decides from ten labels
# only when every one of them was decided right out of fold.
MIN_DECIDED = 10
# Training labels below which the chosen threshold decides nothing (the model is still made:
# its p >= 0.5 answer and explain's probability). From ten labels, ten out-of-fold decisions
# are all of them, each made by an inner model of eight: on releases.yaml they were all right
# and the stage still decided a fifth of new changes at precision 0.80 (docs/judge-learning.md).
MIN_DECIDING_LABELS = 20
_SEED = 0


def family_features(family: str, blocks: Mapping[str, np.ndarray]) -> np.ndarray:
    """The feature matrix of ``family`` from its ``blocks`` (one row per change each).

    >>> family_features("both", {"text": np.zeros((2, 384)), "numbers": np.ones((2, 3))}).shape
    (2, 387)
    """
    return np.hstack([blocks[name] for name in BLOCKS[family]])


def usable(families: Sequence[str], blocks: Mapping[str, np.ndarray]) -> list[str]:
    """The ``families`` whose blocks have columns, numbers allowed to be none (a watch may
    have no numeric column), each only if it reads other blocks than the families before it
    (without numbers, "both" is the text again).

    >>> usable(FAMILIES, {"text": np.zeros((2, 4)), "numbers": np.zeros((2, 0)),
    ...                   "fields": np.zeros((2, 3)), "ngrams": np.zeros((2, 0))})
    ['fields', 'text']
    """

    def has(name: str) -> bool:
        return name in blocks and blocks[name].shape[1] > 0

    found, seen = [], set()
    for family in families:
        names = frozenset(name for name in BLOCKS[family] if has(name))
        if names and names not in seen and all(has(n) or n == "numbers" for n in BLOCKS[family]):
            found.append(family)
            seen.add(names)
    return found or ["text"]


def classifier(folds: int) -> Any:
    """A logistic regression calibrated by sigmoid over ``folds``, for any family's features
    (numbers come standardized, learned_features.standardized, so their weight does not
    depend on units; embeddings are left as they are: unit-length rows, every dimension on the
    same small scale). No sklearn Pipeline: it would not pass sample weights through."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1.0, max_iter=5000, class_weight="balanced")
    return CalibratedClassifierCV(model, method="sigmoid", cv=folds)


def choose_threshold(
    p: np.ndarray,
    y: np.ndarray,
    fold: np.ndarray | None = None,
    *,
    target: float,
    min_decided: int = MIN_DECIDED,
) -> float:
    """The lowest threshold at which the decisions on out-of-fold ``p`` keep precision,
    recall and accuracy at ``target``, pooled and within each ``fold`` (1.0, deciding
    nothing, when none does), from at least ``min_decided`` decisions. A threshold ``t``
    decides notify at ``p >= t``, skip at ``p <= 1 - t``.

    One false notify among 21 holds pooled, not in the fold of seven where it fell:

    >>> p, y = np.array([0.95] * 10 + [0.05] * 10 + [0.7]), np.array([1] * 10 + [0] * 11)
    >>> choose_threshold(p, y, target=0.9)
    0.5
    >>> choose_threshold(p, y, np.arange(21) % 3, target=0.9)
    0.71
    >>> choose_threshold(p, y, np.arange(21) % 3, target=0.9, min_decided=21)
    1.0
    """
    folds = [] if fold is None else [fold == f for f in np.unique(fold)]
    for threshold in np.round(np.arange(0.5, 1.0, 0.01), 2):
        decided = (p >= threshold) | (p <= 1 - threshold)
        if decided.sum() < min_decided:
            break  # higher thresholds decide fewer still
        if all(_holds(p[s] >= 0.5, y[s] == 1, target) for s in
               [decided, *(decided & f for f in folds)]):
            return float(threshold)
    return 1.0


def _holds(notify: np.ndarray, actual: np.ndarray, target: float) -> bool:
    """Precision, recall and accuracy of ``notify`` against ``actual`` at ``target`` (an
    undefined one, no notify said or none due, holds)."""
    if not len(actual):
        return True
    said, due, right = notify.sum(), actual.sum(), (notify & actual).sum()
    return bool(
        (notify == actual).mean() >= target
        and (not said or right / said >= target)
        and (not due or right / due >= target)
    )


class Choice:
    """What ``choose`` settled on: the family, its threshold, and each family's score."""

    def __init__(self, family: str, threshold: float, scores: dict[str, float]) -> None:
        self.family, self.threshold, self.scores = family, threshold, scores


def choose(
    blocks: Mapping[str, np.ndarray],
    y: np.ndarray,
    *,
    weights: np.ndarray | None,
    folds: int,
    inner: int,
    target: float,
    families: Sequence[str] = FAMILIES,
    every_fold: bool = True,
    min_decided: int = MIN_DECIDED,
    threshold: float | None = None,
) -> Choice:
    """The family with the best out-of-fold Brier score over ``folds`` stratified folds of
    the training labels, and the threshold chosen on its out-of-fold probabilities (or the
    user's ``threshold``); ``every_fold=False`` asks the threshold to hold pooled only (the
rule before issue 33's second round, kept to compare). Families whose blocks are empty (no
numbers, no n-grams) are skipped."""
    from sklearn.model_selection import StratifiedKFold

    splits = list(StratifiedKFold(folds, shuffle=True, random_state=_SEED).split(y, y))
    fold = np.zeros(len(y), dtype=int)
    for index, (_, test) in enumerate(splits):
        fold[test] = index
    scores: dict[str, float] = {}
    best: tuple[float, str, np.ndarray] | None = None
    for family in usable(families, blocks):
        x = family_features(family, blocks)
        p = np.zeros(len(y))
        for train, test in splits:
            model = classifier(inner)
            params = {} if weights is None else {"sample_weight": weights[train]}
            model.fit(x[train], y[train], **params)
            p[test] = model.predict_proba(x[test])[:, 1]
        scores[family] = float(np.mean((p - y) ** 2))
        if best is None or scores[family] < best[0]:
            best = (scores[family], family, p)
    assert best is not None
    _, family, p = best
    if threshold is None:
        threshold = 1.0 if len(y) < MIN_DECIDING_LABELS else choose_threshold(
            p, y, fold if every_fold else None, target=target, min_decided=min_decided
        )
    return Choice(family, threshold, scores)
