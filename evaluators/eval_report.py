"""The eval report: how each model's verdicts compare with the labels, per condition.

Computed from results (evaluators/eval_results.py), so a stopped run reports what it did.
Per model, and per condition within it (``all`` is the model's whole run):

* the confusion matrix: expected notify/skip against got notify, skip or no verdict;
* precision (of the changes it would notify about, the share a person wanted) and recall (of
  the changes a person wanted, the share it would notify about), and their harmonic mean F1.
  An example without a verdict counts as not notified: a model that cannot answer the hard
  cases does not score as if they did not exist;
* unanswered (no answer: the server failed, or refused the change's request) and invalid
  (an answer, but no valid verdict), latency p50/p95 per judgement, tokens and requests;
* for a cascade (evaluators/cascade.py), how many examples each of its judges was asked: its
  judges alone are models of the report too, so the cascade's F1 and calls sit beside theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
from changewatch.evaluators.eval_results import EvalResult

__all__ = ["ALL", "format_report", "never_answered", "report"]

# The name of a model's row over all its conditions.
ALL = "all"
_SCHEMA = {
    "model": pl.String,
    "endpoint": pl.String,
    "condition": pl.String,
    "example": pl.String,
    "expect": pl.String,
    "got": pl.String,
    "answer": pl.String,
    "confidence": pl.Float64,
    "reasoning": pl.String,
    "error": pl.String,
    "latency_ms": pl.Int64,
    "calls": pl.Int64,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
}


def _cell(expect: str, got: str | None) -> pl.Expr:
    hit = pl.col("got").is_null() if got is None else pl.col("got") == got
    return ((pl.col("expect") == expect) & hit).sum()


def _ratio(numerator: str, denominator: str) -> pl.Expr:
    return pl.when(pl.col(denominator) > 0).then(pl.col(numerator) / pl.col(denominator))


def _harmonic_mean(a: str, b: str) -> pl.Expr:
    both = pl.col(a) + pl.col(b)
    return pl.when(both > 0).then(2 * pl.col(a) * pl.col(b) / both)


def _scores(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """One row of metrics per group of ``by``."""
    counts = frame.group_by(by, maintain_order=True).agg(
        examples=pl.len(),
        true_positive=_cell("notify", "notify"),
        false_negative=_cell("notify", "skip"),
        notify_no_verdict=_cell("notify", None),
        false_positive=_cell("skip", "notify"),
        true_negative=_cell("skip", "skip"),
        skip_no_verdict=_cell("skip", None),
        unanswered=(pl.col("answer") == "unanswered").sum(),
        invalid=(pl.col("answer") == "invalid").sum(),
        p50_ms=pl.col("latency_ms").quantile(0.5, "nearest").cast(pl.Int64),
        p95_ms=pl.col("latency_ms").quantile(0.95, "nearest").cast(pl.Int64),
        prompt_tokens=pl.col("prompt_tokens").sum(),
        completion_tokens=pl.col("completion_tokens").sum(),
        calls=pl.col("calls").sum(),
    )
    return (
        counts.with_columns(
            flagged=pl.col("true_positive") + pl.col("false_positive"),
            wanted=pl.col("true_positive") + pl.col("false_negative") + pl.col("notify_no_verdict"),
            agreed=pl.col("true_positive") + pl.col("true_negative"),
        )
        .with_columns(
            precision=_ratio("true_positive", "flagged"),
            recall=_ratio("true_positive", "wanted"),
            agreement=_ratio("agreed", "examples"),
        )
        .with_columns(f1=_harmonic_mean("precision", "recall"))
        .drop("flagged", "wanted", "agreed")
    )


def report(results: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """Per model (in the order first seen): its endpoint, its metrics per condition and over
    all (``ALL``), and one line per example it got wrong or could not answer."""
    frame = pl.DataFrame([r.model_dump() for r in results], schema=_SCHEMA, strict=False)
    per_condition = _scores(frame, ["model", "condition"])
    per_model = _scores(frame, ["model"]).with_columns(condition=pl.lit(ALL))
    asked = _asked(results)
    models = []
    for (model,), rows in frame.group_by(["model"], maintain_order=True):
        conditions = {
            row.pop("condition"): _metrics(row)
            for row in per_condition.filter(pl.col("model") == model).iter_rows(named=True)
        }
        (overall,) = per_model.filter(pl.col("model") == model).iter_rows(named=True)
        conditions[ALL] = _metrics(overall)
        models.append(
            {
                "model": model,
                "endpoint": rows["endpoint"][-1],
                "conditions": conditions,
                "misses": _misses(rows),
                # A cascade's calls per judge: how many examples each of its judges was asked.
                **({"asked": asked[model]} if asked.get(model) else {}),
            }
        )
    return models


def _asked(results: Sequence[EvalResult]) -> dict[str, dict[str, int]]:
    """Per cascade (a model whose results name the judges asked): examples each judge got."""
    asked: dict[str, dict[str, int]] = {}
    for result in results:
        for judge in result.asked:
            counts = asked.setdefault(result.model, {})
            counts[judge] = counts.get(judge, 0) + 1
    return asked


def _metrics(row: dict[str, Any]) -> dict[str, Any]:
    shares = {k: None if row[k] is None else round(row[k], 4) for k in ("precision", "recall")}
    return {
        "examples": row["examples"],
        "confusion": {
            "notify": {
                "notify": row["true_positive"],
                "skip": row["false_negative"],
                "none": row["notify_no_verdict"],
            },
            "skip": {
                "notify": row["false_positive"],
                "skip": row["true_negative"],
                "none": row["skip_no_verdict"],
            },
        },
        **shares,
        "f1": None if row["f1"] is None else round(row["f1"], 4),
        "agreement": None if row["agreement"] is None else round(row["agreement"], 4),
        "unanswered": row["unanswered"],
        "invalid": row["invalid"],
        "latency_ms": {"p50": row["p50_ms"], "p95": row["p95_ms"]},
        "tokens": {"prompt": row["prompt_tokens"], "completion": row["completion_tokens"]},
        "calls": row["calls"],
    }


def _misses(rows: pl.DataFrame) -> list[str]:
    wrong = rows.filter(pl.col("got").is_null() | (pl.col("got") != pl.col("expect")))
    lines = []
    for row in wrong.iter_rows(named=True):
        where = f"{row['condition']}: {row['example']}: expected {row['expect']}"
        if row["got"] is None:
            lines.append(f"{where}, {row['answer']} ({row['error']})")
        else:
            lines.append(
                f"{where}, got {row['got']} (confidence {row['confidence']:.2f}): "
                + " ".join((row["reasoning"] or "").split())
            )
    return lines


def never_answered(models: Sequence[dict[str, Any]], results: Sequence[EvalResult]) -> list[str]:
    """A line for each model that gave no verdict at all: its scores measure nothing.

    >>> from changewatch.evaluators.eval_results import EvalResult
    >>> lost = EvalResult(model="m", endpoint="http://h:1/v1", condition="c", example="e",
    ...     split=None, expect="skip", got=None, answer="unanswered", confidence=None,
    ...     reasoning=None, error="timed out", judge_version="v", latency_ms=1, calls=1,
    ...     prompt_tokens=0, completion_tokens=0)
    >>> never_answered(report([lost]), [lost])
    ["model 'm' at http://h:1/v1 never answered (1 example(s)): timed out"]
    """
    lines = []
    for model in models:
        overall = model["conditions"][ALL]
        if overall["unanswered"] + overall["invalid"] < overall["examples"]:
            continue
        errors = [r.error for r in results if r.model == model["model"] and r.error]
        lines.append(
            f"model {model['model']!r} at {model['endpoint'] or 'its default endpoint'} never "
            f"answered ({overall['examples']} example(s)): {errors[-1] if errors else '?'}"
        )
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_report(models: Sequence[dict[str, Any]], *, misses: bool = True) -> str:
    """The report as text: per model a table of its conditions, its confusion matrix over
    all conditions, then (with ``misses``) each example it got wrong.

    >>> from changewatch.evaluators.eval_results import EvalResult
    >>> def result(expect, got):
    ...     return EvalResult(model="m", endpoint="http://h:1/v1", condition="prices",
    ...         example=f"{expect}-{got}", split="test", expect=expect, got=got,
    ...         answer="verdict", confidence=0.9, reasoning="because", error=None,
    ...         judge_version="v", latency_ms=120, calls=1, prompt_tokens=300,
    ...         completion_tokens=40)
    >>> text = format_report(report([result("notify", "notify"), result("skip", "notify"),
    ...     result("skip", "skip")]), misses=False)
    >>> print(text)  # doctest: +NORMALIZE_WHITESPACE
    model m at http://h:1/v1
    condition  examples  precision  recall    F1  unanswered  invalid  p50 ms  p95 ms  tokens  calls
    prices            3       0.50    1.00  0.67           0        0     120     120    1020      3
    all               3       0.50    1.00  0.67           0        0     120     120    1020      3
    confusion over all (rows: expected; columns: got)
                  notify    skip  no verdict
    notify             1       0           0
    skip               1       1           0
    """
    blocks = []
    for model in models:
        conditions = model["conditions"]
        width = max(9, *(len(name) for name in conditions))
        lines = [
            f"model {model['model']} at {model['endpoint'] or 'its default endpoint'}",
            f"{'condition':<{width}}  examples  precision  recall    F1  unanswered  invalid"
            "  p50 ms  p95 ms  tokens  calls",
        ]
        for name, m in conditions.items():
            tokens = m["tokens"]["prompt"] + m["tokens"]["completion"]
            lines.append(
                f"{name:<{width}}  {m['examples']:>8}  {_share(m['precision']):>9}  "
                f"{_share(m['recall']):>6}  {_share(m['f1']):>4}  {m['unanswered']:>10}  "
                f"{m['invalid']:>7}  {m['latency_ms']['p50']:>6}  {m['latency_ms']['p95']:>6}  "
                f"{tokens:>6}  {m['calls']:>5}"
            )
        if "asked" in model:
            lines.append(
                "judges asked: "
                + ", ".join(f"{judge} {count}" for judge, count in model["asked"].items())
                + f" (of {conditions[ALL]['examples']} examples)"
            )
        matrix = conditions[ALL]["confusion"]
        lines.append("confusion over all (rows: expected; columns: got)")
        lines.append(f"{'':<10}  {'notify':>6}  {'skip':>6}  {'no verdict':>10}")
        for expected in ("notify", "skip"):
            row = matrix[expected]
            lines.append(f"{expected:<10}  {row['notify']:>6}  {row['skip']:>6}  {row['none']:>10}")
        if misses and model["misses"]:
            lines += ["wrong or without a verdict:"] + [f"  {m}" for m in model["misses"]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
