"""Examples files: labelled changes a judge is scored against (``changewatch eval``).

An examples file (``evals/<watch>.yaml`` next to the watches file, or any file named with
``--examples``) lists changes with the answer a person expects, and may name the condition
they were labelled against and the source they come from::

    condition: The issue was closed without a fix being merged.
    source: demo_issues
    examples:
      - name: closed as duplicate of an open issue
        kind: update
        old: {state: open, title: Login fails}
        new: {state: closed, title: Login fails, state_reason: duplicate}
        expect: notify
        reason: The duplicate's original is still open, so nothing was fixed.
        split: tune
      - old: {state: open}
        new: {state: closed, state_reason: completed}
        expect: skip

``split`` keeps prompt tuning honest: tune a prompt on the ``tune`` examples only and report
scores on the held-out ``test`` ones (``changewatch eval --split test``). Judging them is
evaluators/eval_run.py's job, scoring evaluators/eval_report.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from changewatch.evaluators.judge import ChangeForJudge
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "EvalError",
    "EvalExample",
    "ExamplesFile",
    "example_files",
    "examples_path",
    "load_examples",
    "load_examples_file",
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


def example_files(paths: Sequence[Path]) -> list[Path]:
    """The examples files ``paths`` name: each a file, or a folder of ``*.yaml`` files.

    ``EvalError`` names a path that is neither, or a folder without examples files.
    """
    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.yaml"))
            if not found:
                raise EvalError(f"{path}: no examples files (*.yaml) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise EvalError(f"{path}: cannot read the examples file: No such file or directory")
    return files
