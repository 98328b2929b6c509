"""The eval harness: a watch's judge scored against labelled examples, model by model.

An examples file (``evals/<watch>.yaml`` next to the watches file) lists changes with the
answer a person expects::

    examples:
      - name: closed as duplicate of an open issue
        kind: update
        old: {state: open, title: Login fails}
        new: {state: closed, title: Login fails, state_reason: duplicate}
        expect: notify
      - old: {state: open}
        new: {state: closed, state_reason: completed}
        expect: skip

Each example goes to the watch's judge exactly as a real change would (same prompt, same
``min_confidence``), once per model asked for, and never through the verdict cache: an eval
measures the model. The watch's SQL filter is not applied; examples stand for changes that
already passed it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from changewatch.evaluators.config import Watch
from changewatch.evaluators.judge import ChangeForJudge, Judge, JudgeOutcome
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "EvalError",
    "EvalExample",
    "ExamplesFile",
    "ModelScore",
    "examples_path",
    "format_scores",
    "load_examples",
    "load_examples_file",
    "never_answered",
    "score_model",
]

Expectation = Literal["notify", "skip"]
Split = Literal["tune", "test"]


class EvalError(ValueError):
    """An examples file cannot be used (missing, not YAML, or not of the expected shape)."""


class EvalExample(BaseModel):
    """One labelled change."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    kind: Literal["insert", "update", "delete"] = "update"
    key: str = "example"
    source: str = "eval"
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    changed_columns: list[str] | None = None
    url: str | None = None
    expect: Expectation
    # Why a person labelled it so, in one line (the repository's evals/ give one each).
    reason: str | None = None
    # tune: a prompt may be tuned on it; test: held out, scores are reported on it.
    split: Split | None = None

    def change(self, watch: str) -> ChangeForJudge:
        """The change as the judge sees it; changed columns default to those that differ."""
        changed = self.changed_columns
        if changed is None and self.old is not None and self.new is not None:
            changed = sorted(
                k for k in self.old.keys() | self.new.keys() if self.old.get(k) != self.new.get(k)
            )
        return ChangeForJudge(
            watch=watch,
            source=self.source,
            kind=self.kind,
            object_key=self.key,
            old=self.old,
            new=self.new,
            changed_columns=changed,
            url=self.url,
        )

    def label(self, index: int) -> str:
        return self.name or f"example {index + 1}"


class ExamplesFile(BaseModel):
    """An examples file: the changes, and what they were labelled against."""

    model_config = ConfigDict(extra="forbid")

    watch: str | None = None
    # The judge condition (its prompt text) the examples were labelled against.
    condition: str | None = Field(default=None, min_length=3)
    # The source name the examples' changes come from, unless an example names its own.
    source: str | None = None
    examples: list[EvalExample] = Field(min_length=1)

    @model_validator(mode="after")
    def _source_of_examples(self) -> ExamplesFile:
        if self.source is not None:
            for example in self.examples:
                if "source" not in example.model_fields_set:
                    example.source = self.source
        return self


def examples_path(config_file: Path, watch: str) -> Path:
    """Where a watch's examples live by default: ``evals/<watch>.yaml`` beside the config.

    >>> examples_path(Path("/srv/cw/watches.yaml"), "closed_bugs").as_posix()
    '/srv/cw/evals/closed_bugs.yaml'
    """
    return config_file.parent / "evals" / f"{watch}.yaml"


def load_examples(path: Path) -> list[EvalExample]:
    """The examples of an examples file (see ``load_examples_file``)."""
    return load_examples_file(path).examples


def load_examples_file(path: Path) -> ExamplesFile:
    """Read an examples file; ``EvalError`` names the file (and example) on any problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise EvalError(f"{path}: cannot read the examples file: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise EvalError(f"{path}: not valid YAML: {error}") from None
    try:
        return ExamplesFile.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EvalError(f"{path}: {where}: {first['msg']}") from None


@dataclass
class ModelScore:
    """How one model's judgements compare with the expected answers."""

    model: str
    true_positive: int = 0
    false_positive: int = 0
    false_negative: int = 0
    true_negative: int = 0
    unanswered: int = 0  # the judge gave no verdict (unreachable, invalid answers)
    calls: int = 0  # requests sent, retries included
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies_ms: list[int] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)  # one line per disagreement
    endpoint: str = ""  # the model server's URL, without credentials
    last_error: str | None = None  # why the latest unanswered example got no verdict

    @property
    def examples(self) -> int:
        return (
            self.true_positive
            + self.false_positive
            + self.false_negative
            + self.true_negative
            + self.unanswered
        )

    @property
    def precision(self) -> float | None:
        """Of the changes it would notify about, the share a person wanted."""
        flagged = self.true_positive + self.false_positive
        return self.true_positive / flagged if flagged else None

    @property
    def recall(self) -> float | None:
        """Of the changes a person wanted, the share it would notify about."""
        wanted = self.true_positive + self.false_negative
        return self.true_positive / wanted if wanted else None

    @property
    def agreement(self) -> float:
        """The share of examples answered as expected (no answer counts as a disagreement)."""
        return (self.true_positive + self.true_negative) / self.examples if self.examples else 0.0

    def record(self, label: str, expected: Expectation, outcome: JudgeOutcome) -> None:
        self.calls += outcome.attempts
        self.prompt_tokens += outcome.prompt_tokens
        self.completion_tokens += outcome.completion_tokens
        self.latencies_ms.append(outcome.latency_ms)
        if outcome.verdict is None:
            self.unanswered += 1
            self.last_error = outcome.error
            self.misses.append(f"{label}: expected {expected}, no answer ({outcome.error})")
            return
        notify = outcome.notify
        if expected == "notify":
            self.true_positive += notify
            self.false_negative += not notify
        else:
            self.false_positive += notify
            self.true_negative += not notify
        if notify != (expected == "notify"):
            got = "notify" if notify else "skip"
            verdict = outcome.verdict
            self.misses.append(
                f"{label}: expected {expected}, got {got} "
                f"(confidence {verdict.confidence:.2f}): {verdict.reasoning}"
            )


def score_model(
    watch: Watch,
    examples: Sequence[EvalExample],
    model: str | None = None,
    *,
    make_judge: Callable[..., Judge] = Judge,
) -> ModelScore:
    """Judge every example with ``watch``'s judge (its model, or ``model``) and score it."""
    if watch.judge is None:
        raise EvalError(f"watch {watch.name!r} has no judge to evaluate")
    config = watch.judge if model is None else watch.judge.model_copy(update={"model": model})
    score = ModelScore(model=config.model)
    with make_judge(config) as judge:
        score.endpoint = judge.url
        for index, example in enumerate(examples):
            outcome = judge.evaluate(example.change(watch.name))
            score.record(example.label(index), example.expect, outcome)
    return score


def never_answered(scores: Iterable[ModelScore]) -> list[str]:
    """A line for each model that answered none of its examples: its score measures nothing.

    >>> lost = ModelScore("m", unanswered=2, endpoint="http://h:1/v1", last_error="timed out")
    >>> never_answered([lost, ModelScore("n", true_positive=1)])
    ["model 'm' at http://h:1/v1 never answered (2 example(s)): timed out"]
    """
    return [
        f"model {s.model!r} at {s.endpoint or 'its default endpoint'} never answered "
        f"({s.unanswered} example(s)): {s.last_error}"
        for s in scores
        if s.examples and s.unanswered == s.examples
    ]


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def format_scores(scores: Iterable[ModelScore]) -> str:
    """A table of the scores, one model per row, then each model's disagreements.

    >>> score = ModelScore("m", true_positive=3, false_positive=1, true_negative=4, calls=8)
    >>> print(format_scores([score]).splitlines()[1])
    m            8       0.75   1.00      0.88       8       0            -
    """
    scores = list(scores)
    width = max([5] + [len(s.model) for s in scores])
    header = (
        f"{'model':<{width}} {'examples':>8} {'precision':>10} {'recall':>6} "
        f"{'agreement':>9} {'calls':>7} {'tokens':>7} {'p50 latency':>12}"
    )
    rows, notes = [header], []
    for s in scores:
        latency = f"{statistics.median(s.latencies_ms):.0f} ms" if s.latencies_ms else "-"
        rows.append(
            f"{s.model:<{width}} {s.examples:>8} {_share(s.precision):>10} {_share(s.recall):>6} "
            f"{s.agreement:>9.2f} {s.calls:>7} {s.prompt_tokens + s.completion_tokens:>7} "
            f"{latency:>12}"
        )
        notes += [f"{s.model}: {miss}" for miss in s.misses]
    return "\n".join(rows + ([""] + notes if notes else []))
