"""Judging labelled examples for ``changewatch eval``: each set, model by model.

Each example goes to the judge exactly as a real change would (same prompt, same
``min_confidence``) and never through the verdict cache: an eval measures the model. A watch's
SQL filter is not applied; examples stand for changes that already passed it. Every result is
written the moment it is judged (evaluators/eval_results.py). A model whose server fails
``STOP_AFTER`` times in a row is not asked about the rest: the evaluation's circuit breaker,
for the same reason (a server that is down fails every example the same way, each after its
timeout), and likewise only for the server's faults.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from changewatch.evaluators.cascade import AnyJudge, Cascade, make_judge
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.eval_results import ResultsWriter, result_of
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import Judge, JudgeOutcome

__all__ = ["STOP_AFTER", "EvalSet", "run_eval"]

STOP_AFTER = 3


@dataclass(frozen=True)
class EvalSet:
    """Examples and the judge they are scored with: a condition's file, or a watch's."""

    name: str  # the condition's name in the report (the examples file's stem)
    watch: str  # the watch name the judge's prompt shows
    judge: JudgeConfig
    examples: Sequence[EvalExample]
    path: Path | None = None  # the examples file


def run_eval(
    sets: Sequence[EvalSet],
    models: Sequence[str | None],
    writer: ResultsWriter,
    *,
    done: Collection[tuple[str, str, str, str]] = (),
    make_judge: Callable[[JudgeConfig], AnyJudge] = make_judge,
) -> list[str]:
    """Judge every example of ``sets`` with each model (None: the set's own), writing each
    result to ``writer``; results whose key is in ``done`` (a resumed run's) are not asked
    again. Returns a line for each model stopped because its server kept failing.

    A cascade (a judge config with ``then``) is scored as a whole, under its models' names
    joined by " > ", and each of its judges alone: a judge's answer within the cascade is its
    answer alone too, so only the examples the cascade did not bring to it are asked again.
    """
    stopped = []
    for model in models:
        failures = 0
        for eval_set in sets:
            config = eval_set.judge
            if model is not None:
                config = config.model_copy(update={"model": model})
            with make_judge(config) as judge:
                for index, example in enumerate(eval_set.examples):
                    scored = _Scored(eval_set, example, example.label(index), writer, done)
                    if isinstance(judge, Cascade):
                        outcome = scored.cascade(judge)
                    else:
                        outcome = scored.alone(judge)
                    if outcome is None:
                        continue  # judged by the run resumed
                    if outcome.fault == "server":
                        failures += 1
                    elif outcome.verdict is not None:
                        failures = 0
                    if failures >= STOP_AFTER:
                        break
            if failures >= STOP_AFTER:
                stopped.append(
                    f"model {config.model!r} at {judge.url}: stopped after {failures} failures "
                    f"of its server in a row ({outcome.error}); the rest was not asked"
                )
                break
    return stopped


@dataclass(frozen=True)
class _Scored:
    """One example of a set being judged: asks and writes its results, skipping done ones."""

    eval_set: EvalSet
    example: EvalExample
    label: str
    writer: ResultsWriter
    done: Collection[tuple[str, str, str, str]]

    def _write(self, outcome: JudgeOutcome, endpoint: str, model: str | None = None) -> None:
        self.writer.write(
            result_of(
                outcome,
                endpoint=endpoint,
                condition=self.eval_set.name,
                label=self.label,
                example=self.example,
                model=model,
            )
        )

    def _key(self, model: str, version: str) -> tuple[str, str, str, str]:
        return (model, version, self.eval_set.name, self.label)

    def alone(self, judge: Judge, answered: JudgeOutcome | None = None) -> JudgeOutcome | None:
        """The judge's result (``answered``, or asked now), unless the resumed run has it."""
        if self._key(judge.model_id, judge.version) in self.done:
            return None
        outcome = answered or judge.evaluate(self.example.change(self.eval_set.watch))
        self._write(outcome, judge.url)
        return outcome

    def cascade(self, cascade: Cascade) -> JudgeOutcome | None:
        """The cascade's result, then each of its judges' alone."""
        outcome = None
        name = cascade.label
        if self._key(name, cascade.version) not in self.done:
            outcome = cascade.evaluate(self.example.change(self.eval_set.watch))
            self._write(outcome, cascade.url, model=name)
        stages = outcome.stages if outcome is not None else ()
        for index, judge in enumerate(cascade.judges):
            self.alone(judge, stages[index] if index < len(stages) else None)
        return outcome
