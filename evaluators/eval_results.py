"""Eval results as JSON lines: one line per judged example, written the moment it is judged.

A results file is the eval's record: the report (evaluators/eval_report.py) is computed from
it, so a run stopped half-way (Ctrl-C, a killed process, a machine that went away) keeps every
judgement it paid for, and ``--resume`` carries on from there instead of asking again. Each
line is flushed as it is written; a killed process leaves at most its last line cut, which
``read_results`` drops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Literal

from changewatch.evaluators.evals import EvalError, EvalExample, Expectation
from changewatch.evaluators.judge import JudgeOutcome
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Answer", "EvalResult", "ResultsWriter", "read_results", "result_of"]

# verdict: the model judged it; invalid: the model answered, but no valid verdict came of it;
# unanswered: no answer at all (server down or failing, the change's request refused).
Answer = Literal["verdict", "invalid", "unanswered"]


class EvalResult(BaseModel):
    """One example judged by one model."""

    model_config = ConfigDict(extra="ignore")

    model: str
    endpoint: str  # the model server's URL, without credentials
    condition: str  # the examples file's name (``incidents`` for evals/incidents.yaml)
    example: str
    split: str | None
    expect: Expectation
    got: Expectation | None  # None: no verdict
    answer: Answer
    confidence: float | None
    reasoning: str | None
    error: str | None
    judge_version: str
    latency_ms: int
    calls: int  # requests sent, retries included
    prompt_tokens: int
    completion_tokens: int
    # A cascade's result: the models asked about the example, in order (evaluators/cascade.py).
    asked: list[str] = []

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a result stands for: the same example, prompt and model judged again."""
        return (self.model, self.judge_version, self.condition, self.example)


def result_of(
    outcome: JudgeOutcome,
    *,
    endpoint: str,
    condition: str,
    label: str,
    example: EvalExample,
    model: str | None = None,
) -> EvalResult:
    """The result of judging ``example`` (named ``label``) as ``outcome`` says, under the
    name ``model`` (default: the outcome's)."""
    verdict = outcome.verdict
    if verdict is not None:
        answer: Answer = "verdict"
    else:
        answer = "invalid" if outcome.fault == "answer" else "unanswered"
    return EvalResult(
        model=model or outcome.model,
        endpoint=endpoint,
        condition=condition,
        example=label,
        split=example.split,
        expect=example.expect,
        got=None if verdict is None else ("notify" if outcome.notify else "skip"),
        answer=answer,
        confidence=None if verdict is None else verdict.confidence,
        reasoning=None if verdict is None else verdict.reasoning,
        error=outcome.error,
        judge_version=outcome.judge_version,
        latency_ms=outcome.latency_ms,
        calls=outcome.attempts,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        asked=[stage.model for stage in outcome.stages],
    )


def read_results(path: Path) -> list[EvalResult]:
    """The results in ``path`` (none if it does not exist); a cut last line is dropped.

    ``EvalError`` names the file and line of anything else that is not a result.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise EvalError(f"{path}: cannot read the results file: {error.strerror}") from None
    results = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            results.append(EvalResult.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            if number == len(lines):
                break  # the line a stopped run was writing
            raise EvalError(f"{path}:{number}: not an eval result") from None
    return results


class ResultsWriter:
    """Appends results to a JSON-lines file, each flushed as it is written. Close it (or
    use ``with``)."""

    def __init__(self, path: Path, *, resume: bool = False) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists():
            _drop_cut_line(path)  # else the next result would continue it
        self._file: IO[str] = path.open("a" if resume else "w", encoding="utf-8")

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, result: EvalResult) -> None:
        self._file.write(result.model_dump_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _drop_cut_line(path: Path) -> None:
    """Remove a last line without its newline: the one a stopped run was writing."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("rb+") as file:
            file.truncate(data.rfind(b"\n") + 1)
