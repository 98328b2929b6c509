"""Training a watch's learned stage from everything labelled so far (``changewatch train``).

Labels, in order of weight: people's ratings of notifications (the feedback table: useful ->
notify, noise -> skip), the watch's examples file (evals/<watch>.yaml), and the verdicts its
served LLM judge gave (weak labels, half weight). A fifth of the people's labels, picked by a
hash of the change's prompt so the same ones stay out across runs, is held out: every model is
trained without them and scored on them, and a new model replaces the one in use only if it
scores no worse there (F1 of its notify/skip answers). The outcome is one line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from changewatch.evaluators import learned
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import render_user_prompt
from changewatch.evaluators.learned_selection import MIN_DECIDING_LABELS

__all__ = ["HELD_OUT", "Label", "f1", "labels_of", "train"]

# The share of people's labels kept out of training, to compare models on.
HELD_OUT = 0.2
# A served judge's verdict counts this much against a person's label.
SERVED_WEIGHT = 0.5
# What each feature family reads, as the train line says it.
_FAMILY = {
    "text": "text",
    "numbers": "numbers",
    "both": "text and numbers",
    "fields": "fields (kind, changed columns, short values, condition terms) and numbers",
    "ngrams": "new text's character n-grams",
}


@dataclass(frozen=True)
class Label:
    prompt: str  # the change as the judge's prompt shows it
    notify: bool
    weight: float = 1.0  # 1: a person's; SERVED_WEIGHT: the served judge's

    @property
    def held_out(self) -> bool:
        """Whether this (person's) label is kept out of training, stably by its prompt."""
        digest = hashlib.sha256(self.prompt.encode()).digest()
        return self.weight == 1.0 and digest[0] < 256 * HELD_OUT


def labels_of(
    watch: str,
    examples: Sequence[EvalExample],
    served: Sequence[tuple[str, bool, float]] = (),
    *,
    min_confidence: float = 0.5,
) -> list[Label]:
    """People's labels (``examples``) and the served judge's verdicts (prompt, notify,
    confidence), one label per prompt: a person's wins over the judge's."""
    by_prompt: dict[str, Label] = {}
    for prompt, notify, confidence in served:
        by_prompt[prompt] = Label(prompt, bool(notify and confidence >= min_confidence),
                                  SERVED_WEIGHT)
    for example in examples:
        prompt = render_user_prompt(example.change(watch))
        by_prompt[prompt] = Label(prompt, example.expect == "notify")
    return list(by_prompt.values())


def f1(predicted: Sequence[bool], actual: Sequence[bool]) -> float:
    """F1 of notify answers.

    >>> f1([True, True, False], [True, False, False])
    0.6666666666666666
    """
    tp = sum(p and a for p, a in zip(predicted, actual, strict=True))
    fp = sum(p and not a for p, a in zip(predicted, actual, strict=True))
    fn = sum(a and not p for p, a in zip(predicted, actual, strict=True))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def _score(model: learned.LearnedModel | None, held: Sequence[Label]) -> float | None:
    if model is None or not held:
        return None
    p = model.probabilities([label.prompt for label in held])
    return f1([bool(x >= 0.5) for x in p], [label.notify for label in held])


def train(
    watch: str, labels: Sequence[Label], path: Path, *, threshold: float | None = None,
    condition: str | None = None,
) -> str:
    """Train on ``labels``, keep the new model at ``path`` if it scores no worse on the
    held-out labels than the one there; one line saying what was done and why.
    ``threshold``: the user's (else chosen on out-of-fold labels, evaluators/learned.py);
    ``condition``: the judge's, whose terms are features (learned_structure)."""
    people = sum(label.weight == 1.0 for label in labels)
    held = [label for label in labels if label.held_out]
    used = [label for label in labels if not label.held_out]
    head = (
        f"train {watch}: {len(labels)} labels ({people} from people, "
        f"{len(labels) - people} from the served judge), {len(held)} held out"
    )
    model = learned.fit(
        [label.prompt for label in used],
        [label.notify for label in used],
        weights=[label.weight for label in used],
        threshold=threshold,
        condition=condition,
    )
    if model is None:
        return (
            f"{head}: too few to train (need {learned.MIN_LABELS}, with "
            f"{learned.MIN_PER_CLASS} of each answer); the learned stage abstains, the LLM decides"
        )
    new, current = _score(model, held), _score(learned.load(path), held)
    said = "no held-out labels" if new is None else f"held-out F1 {new:.2f}"
    if current is not None and new is not None and new < current:
        return (
            f"{head}: {said} < {current:.2f} of the model in use: refused, the model in use "
            "stays"
        )
    learned.save(model, path)
    versus = "" if current is None else f" (model in use: {current:.2f})"
    if model.threshold < 1.0:
        deciding = f"deciding at p >= {model.threshold:.2f} or <= {1 - model.threshold:.2f}"
    elif model.labels < MIN_DECIDING_LABELS:
        deciding = (
            f"deciding nothing until it trains on {MIN_DECIDING_LABELS} labels (it abstains)"
        )
    else:
        deciding = "deciding nothing until more labels agree (it abstains)"
    return (
        f"{head}: {said}{versus}: now in use, learned@{model.version}, reading the change's "
        f"{_FAMILY[model.family]}, {deciding}"
    )
