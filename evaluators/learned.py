"""The learned judge stage: a per-watch classifier that decides where it is sure, else abstains.

``judge: [{model: learned, condition: ...}, {model: gpt-4o-mini, when: unsure}]``: the first
stage answers from a model trained on the watch's own labels (``changewatch train WATCH``,
evaluators/learned_training.py); only the changes it abstains on go to the LLM (the cascade,
evaluators/cascade.py). Features are evaluators/learned_features.py's (the text embedded, the
numbers) and evaluators/learned_structure.py's (the change's fields, its new text's character
n-grams), in the family that scored best out of fold on the training labels; the classifier is a
logistic regression calibrated by cross-validation (sigmoid), so its probability can be
thresholded: it decides notify at ``p >= threshold``, skip at ``p <= 1 - threshold`` and
abstains between. The threshold is the judge's ``threshold``, else the one chosen when
training on out-of-fold probabilities to keep precision, recall and accuracy of its decisions
at 0.9 on every fold (evaluators/learned_selection.py). Cold start: without a trained model
(too few labels) it abstains on everything.

Models are files ``<dir>/<key>.pkl`` (``$CHANGEWATCH_LEARNED_DIR``, default
``.changewatch/learned``), the key a hash of the condition: labels are answers to it.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from changewatch.evaluators import learned_features as lf
from changewatch.evaluators import learned_selection as ls
from changewatch.evaluators import learned_structure as lst
from changewatch.evaluators.config import LEARNED_MODEL, JudgeConfig
from changewatch.evaluators.judge import ChangeForJudge, JudgeOutcome, Verdict, render_user_prompt

__all__ = [
    "DIR_ENV",
    "FEATURES",
    "LEARNED_MODEL",
    "MIN_LABELS",
    "TARGET_PRECISION",
    "LearnedJudge",
    "LearnedModel",
    "fit",
    "load",
    "model_file",
    "save",
]

DIR_ENV = "CHANGEWATCH_LEARNED_DIR"
# Fewer labels than this (or fewer than MIN_PER_CLASS of either answer): no model, abstain.
MIN_LABELS = 10
MIN_PER_CLASS = 3
# What the chosen threshold keeps on held-out (out-of-fold) labels, of the decided share.
TARGET_PRECISION = 0.9
# The feature recipe's version: a model saved under another one is not used (it abstains
# until retrained), since its classifier expects other columns. 2: numeric diffs gained
# "reached zero", and the family (text, numbers, both) is chosen per watch. 3: the fields and
# ngrams families (learned_structure), and the condition's terms.
FEATURES = 3


@dataclass
class LearnedModel:
    """A trained stage: feature recipe, calibrated classifier and its threshold."""

    columns: list[str]  # numeric columns (learned_features.numeric_features)
    classifier: Any  # sklearn's CalibratedClassifierCV
    threshold: float  # decide where max(p, 1 - p) >= this; 1.0: never (abstain)
    labels: int  # how many labels it was trained on
    family: str = "both"  # its features: text, numbers or both (learned_selection)
    # The numeric diffs' mean and spread over the training labels (learned_features.scaling).
    center: np.ndarray | None = None
    scale: np.ndarray | None = None
    # The fields' and n-grams' vocabulary (and the condition's terms), from the training labels.
    structure: lst.Structure | None = None
    features: int = FEATURES
    trained_at: float = field(default_factory=time.time)

    @property
    def version(self) -> str:
        """16 hex of its pickled bytes: the stage's identity in verdicts and caches."""
        return hashlib.sha256(_dumps(self)).hexdigest()[:16]

    def probabilities(self, prompts: Sequence[str]) -> np.ndarray:
        """P(notify) for each change's prompt text."""
        blocks = _blocks(prompts, self.family, self.columns, self.structure)
        if self.center is not None and self.scale is not None:
            blocks["numbers"] = (blocks["numbers"] - self.center) / self.scale
        x = ls.family_features(self.family, blocks)
        return self.classifier.predict_proba(x)[:, 1]


def _blocks(
    prompts: Sequence[str], families: str | Sequence[str], columns: Sequence[str],
    structure: lst.Structure | None,
) -> dict[str, np.ndarray]:
    """The feature blocks ``families`` need (learned_selection.BLOCKS), one row per prompt;
    numbers unscaled. Blocks no family needs are not computed (the embedding is the slow one)."""
    names = {name for family in ([families] if isinstance(families, str) else families)
             for name in ls.BLOCKS[family]}
    blocks = {"numbers": lf.numeric_features(prompts, columns)}
    if "text" in names:
        blocks["text"] = lf.embed(prompts)
    if structure is not None and "fields" in names:
        blocks["fields"] = structure.fields(prompts)
    if structure is not None and "ngrams" in names:
        blocks["ngrams"] = structure.ngrams(prompts)
    return blocks


def fit(prompts: Sequence[str], labels: Sequence[bool], *, weights: Sequence[float] | None = None,
        threshold: float | None = None, condition: str | None = None,
        **choices: Any) -> LearnedModel | None:
    """A stage trained on change prompts and labels (True: notify); None below the cold-start
    minimum. ``weights`` weigh labels (a served judge's verdicts count less than a person's);
    ``condition``: the judge's, whose terms the fields family looks for in each change.
    ``choices`` go to learned_selection.choose (``families``, ``every_fold``, ``min_decided``:
    its defaults are the stage's; others are for comparing, bench/bench_learned.py)."""
    y = np.asarray(labels, dtype=int)
    fewest = min(int(y.sum()), int(len(y) - y.sum()))
    if len(y) < MIN_LABELS or fewest < MIN_PER_CLASS:
        return None
    columns = lf.numeric_columns(prompts)
    families = choices.pop("families", ls.FAMILIES)
    structure = lst.Structure(prompts, condition)
    blocks = _blocks(prompts, families, columns, structure)
    center, scale = lf.scaling(blocks["numbers"])
    blocks["numbers"] = (blocks["numbers"] - center) / scale
    w = None if weights is None else np.asarray(weights, dtype=float)
    inner = max(2, min(3, fewest - 1))
    choice = ls.choose(
        blocks, y, weights=w, folds=min(5, fewest), inner=inner,
        target=TARGET_PRECISION, families=families, threshold=threshold, **choices,
    )
    classifier = ls.classifier(inner)
    x = ls.family_features(choice.family, blocks)
    classifier.fit(x, y, **({} if w is None else {"sample_weight": w}))
    return LearnedModel(
        columns, classifier, choice.threshold, len(y), choice.family, center, scale, structure
    )


def _dumps(model: LearnedModel) -> bytes:
    """The model's parts pickled without pickle's memo: with it, a string two attributes
    happen to share in memory (the same dict key in a fresh model, two equal ones in a loaded
    one) is written once and referred to after, so the same model would have other bytes, and
    another version, fresh from fit and loaded in another process."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer)
    pickler.fast = True  # no memo: nothing in a model refers to itself
    pickler.dump(
        (model.columns, model.classifier, model.threshold, model.labels, model.family,
         model.center, model.scale, model.structure)
    )
    return buffer.getvalue()


def model_file(config: JudgeConfig, directory: Path | None = None) -> Path:
    """Where the stage of ``config``'s condition is kept."""
    directory = directory or Path(os.environ.get(DIR_ENV, ".changewatch/learned"))
    key = hashlib.sha256(config.condition.encode()).hexdigest()[:16]
    return directory / f"{key}.pkl"


def save(model: LearnedModel, path: Path) -> None:
    """Write ``model`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as file:
        pickle.dump(model, file)
    partial.replace(path)


def load(path: Path) -> LearnedModel | None:
    """The model at ``path``; None when none was trained (or it cannot be read)."""
    try:
        with open(path, "rb") as file:
            model = pickle.load(file)  # noqa: S301 (our own file, written by save())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
        return None
    if not isinstance(model, LearnedModel) or getattr(model, "features", 1) != FEATURES:
        return None  # not a model, or one of an older feature recipe: retrain
    return model


class LearnedJudge:
    """The learned stage as a judge: a verdict where it is sure, else none (it abstains)."""

    def __init__(self, config: JudgeConfig, *, model: LearnedModel | None = None) -> None:
        self.config = config
        self.version = "learned"
        self.model = model if model is not None else load(model_file(config))
        if self.model is not None and config.threshold is not None:
            self.model.threshold = config.threshold
        self.model_id = f"learned@{self.model.version}" if self.model else "learned@untrained"
        self.url = "in-process"
        self.learned = True  # the cascade takes its verdict as final: it abstains otherwise

    def evaluate(self, change: ChangeForJudge) -> JudgeOutcome:
        start = time.perf_counter()
        verdict, error = None, None
        if self.model is None:
            error = "abstained: no model trained yet (too few labels; `changewatch train`)"
        else:
            p = float(self.model.probabilities([render_user_prompt(change)])[0])
            sure = max(p, 1 - p)
            note = f"learned stage: p(notify) {p:.2f}, threshold {self.model.threshold:.2f}"
            if sure >= self.model.threshold:
                notify = p >= 0.5
                verdict = Verdict(
                    reasoning=f"[{note}; decided.] Trained on {self.model.labels} labels.",
                    should_notify=notify,
                    urgency="normal",
                    summary=f"{'Matches' if notify else 'Does not match'} the condition "
                    f"(learned stage, p={p:.2f}).",
                    confidence=round(sure, 4),
                )
            else:
                error = f"abstained ({note})"
        return JudgeOutcome(
            verdict=verdict,
            error=error,
            model=self.model_id,
            judge_version=self.version,
            prompt_tokens=0,
            completion_tokens=0,
            latency_ms=max(1, round((time.perf_counter() - start) * 1000)),
            attempts=0,
            min_confidence=self.config.min_confidence,
            fault=None,  # an abstention is nobody's fault: the next judge answers
        )

    def __enter__(self) -> LearnedJudge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        pass  # nothing open: the model is in memory
