"""`changewatch eval`: score judges on labelled examples, per model and per condition.

Two ways in: ``changewatch eval WATCH`` scores the watch's judge on ``evals/<watch>.yaml``;
``changewatch eval --model M`` (no watch) scores model ``M`` on every examples file of
``evals/`` beside the watches file, each judged against the condition the file names, on the
endpoint ``--base-url`` names. Results go to a JSON-lines file as they come
(evaluators/eval_results.py), and the report is computed from that file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changewatch.pipeline.project.expected_errors import UsageError

if TYPE_CHECKING:
    from changewatch.evaluators.config import JudgeConfig
    from changewatch.evaluators.eval_run import EvalSet
    from changewatch.evaluators.evals import ExamplesFile

__all__ = ["RESULTS", "add_parser", "run"]

# Where results go by default, beside the watches file.
RESULTS = Path(".changewatch") / "eval-results.jsonl"


def add_parser(commands: Any) -> None:
    """The `eval` subcommand and its options."""
    evals = commands.add_parser(
        "eval", help="score judges against labelled examples, per model and per condition"
    )
    evals.add_argument(
        "watch",
        nargs="?",
        help="the watch whose judge to score (default: score each --model on the condition "
        "each examples file names)",
    )
    evals.add_argument(
        "--model",
        action="append",
        help="a model to score (repeat for several; default: the watch's own)",
    )
    evals.add_argument(
        "--examples",
        action="append",
        help="an examples file or a folder of them (repeat for several; default: "
        "evals/<watch>.yaml, or evals/, beside the watches file)",
    )
    evals.add_argument(
        "--base-url", help="the models' OpenAI-compatible endpoint (default: the watch's)"
    )
    evals.add_argument(
        "--api-key-env", help="the environment variable holding the endpoint's API key"
    )
    evals.add_argument(
        "--split",
        choices=("tune", "test", "all"),
        default="all",
        help="the examples to tune a prompt on, the held-out ones, or all (default)",
    )
    evals.add_argument(
        "--results",
        help=f"the JSON-lines file each result is written to as it comes (default: {RESULTS} "
        "beside the watches file)",
    )
    evals.add_argument(
        "--resume",
        action="store_true",
        help="keep the results file's results and judge only what it lacks",
    )
    evals.add_argument(
        "--format", choices=("text", "json"), default="text", help="the report's format"
    )
    evals.add_argument(
        "--min-agreement",
        type=float,
        help="exit 1 when any model agrees with fewer than this share of the examples",
    )
    evals.add_argument("--min-f1", type=float, help="exit 1 when any model's F1 is below this")
    evals.add_argument(
        "--cross-validate",
        type=int,
        metavar="K",
        help="K-fold cross-validate the learned judge stage on the examples (the `learn` extra): "
        "alone, as a cascade (the rest to --model, if given), against always-notify, "
        "always-skip and --model alone, with a learning curve; prints a Markdown table "
        "(--format json: its rows)",
    )
    evals.add_argument(
        "--export-feedback",
        action="store_true",
        help="print the watch's rated notifications as an examples file instead",
    )


def run(args: argparse.Namespace) -> int:
    from changewatch.evaluators.eval_report import never_answered, report
    from changewatch.evaluators.eval_results import ResultsWriter, read_results
    from changewatch.evaluators.eval_run import run_eval
    from changewatch.pipeline.project.storage_paths import config_path

    config_file = config_path(args.config)
    if args.export_feedback:
        return _export_feedback(args)
    if args.cross_validate is not None:
        return _cross_validate(args, config_file)
    sets = _watch_sets(args, config_file) if args.watch else _condition_sets(args, config_file)
    results_path = Path(args.results) if args.results else config_file.parent / RESULTS
    done = {r.key for r in read_results(results_path)} if args.resume else set()
    stopped: list[str] = []
    interrupted = False
    with ResultsWriter(results_path, resume=args.resume) as writer:
        try:
            stopped = run_eval(sets, args.model or [None], writer, done=done)
        except KeyboardInterrupt:
            interrupted = True  # what was judged is in the file: report it
    results = read_results(results_path)
    models = report(results)
    silent = never_answered(models, results)
    below = _below(models, args)
    if args.format == "json":
        print(json.dumps(_as_json(sets, args.split, results_path, models, stopped + silent)))
    else:
        _print_text(sets, results_path, models)
    for line in stopped + silent + below:
        print(f"changewatch: {line}", file=sys.stderr)
    if interrupted:
        print(
            f"changewatch: interrupted; {len(results)} result(s) kept in {results_path} "
            "(--resume carries on)",
            file=sys.stderr,
        )
        return 130
    return 1 if silent or below else 0


def _export_feedback(args: argparse.Namespace) -> int:
    from changewatch.evaluators.feedback import examples_yaml, export_examples
    from changewatch.warehouse import connect

    if not args.watch:
        raise UsageError("--export-feedback needs the watch whose rated notifications to export")
    watch = _watch(args).name
    with connect() as wh:
        print(examples_yaml(watch, export_examples(wh, watch)), end="")
    return 0


def _cross_validate(args: argparse.Namespace, config_file: Path) -> int:
    """Print the cross-validation table of each examples file (a watch's, or --examples)."""
    from changewatch.evaluators.evals import example_files, examples_path, load_examples_file

    if args.cross_validate < 2:
        raise UsageError("--cross-validate needs K of at least 2 folds")
    try:
        from changewatch.evaluators.cross_validate import cross_validate, format_rows
    except ModuleNotFoundError:
        from changewatch.evaluators.learned_features import INSTALL_HINT

        raise UsageError(INSTALL_HINT) from None
    if args.watch:
        default = [examples_path(config_file, _watch(args).name)]
    else:
        default = [config_file.parent / "evals"]
    rows = []
    for path in example_files([Path(p) for p in args.examples or default]):
        file = load_examples_file(path)
        watch = args.watch or file.watch or path.stem
        ask = _llm(args, file.condition, watch) if args.model else None
        judge = _watch(args).judge if args.watch else None
        condition = judge.condition if judge is not None else file.condition
        rows += cross_validate(
            path.stem, watch, file.examples, args.cross_validate, ask, condition=condition
        )
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(row) for row in rows]))
    else:
        print(format_rows(rows))
    return 0


def _llm(args: argparse.Namespace, condition: str | None, watch: str) -> Any:
    """Asks --model about an example (the cascade's rest), shown as the learned stage saw it
    (the same watch name in the prompt); a verdict-less answer is skip."""
    from changewatch.evaluators.config import JudgeConfig
    from changewatch.evaluators.evals import EvalError
    from changewatch.evaluators.judge import Judge

    if args.watch:
        config = _watch(args).judge.model_copy(update={"model": args.model[0], "then": []})
        config = config.model_copy(update=_endpoint(args))
    elif condition is None:
        raise EvalError("an examples file without a condition needs a watch to cross-validate")
    else:
        config = JudgeConfig(condition=condition, model=args.model[0], **_endpoint(args))
    judge = Judge(config)
    return lambda example: judge.evaluate(example.change(watch)).notify


def _watch(args: argparse.Namespace) -> Any:
    from changewatch.pipeline.cli.command_line import _known
    from changewatch.pipeline.project.watches_file import load_config

    config = load_config(args.config)
    _known("watch", args.watch, [w.name for w in config.watches])
    return config.watch(args.watch)


def _watch_sets(args: argparse.Namespace, config_file: Path) -> list[EvalSet]:
    """The watch's judge over its examples files (a file's own condition does not apply)."""
    from changewatch.evaluators.evals import examples_path

    watch = _watch(args)
    if watch.judge is None:
        raise UsageError(f"watch {watch.name!r} has no judge: there is nothing to evaluate")
    judge = watch.judge.model_copy(update=_endpoint(args))
    paths = [Path(p) for p in args.examples or [examples_path(config_file, watch.name)]]
    return _sets(paths, args.split, lambda _path, _file: judge, watch=watch.name)


def _condition_sets(args: argparse.Namespace, config_file: Path) -> list[EvalSet]:
    """Each examples file judged against the condition it names, by each ``--model``."""
    from changewatch.evaluators.config import JudgeConfig
    from changewatch.evaluators.evals import EvalError

    if not args.model:
        raise UsageError(
            "name a model to score (--model NAME, or --model local), or a watch whose judge "
            "to score"
        )

    def judge(path: Path, file: ExamplesFile) -> JudgeConfig:
        if file.condition is None:
            raise EvalError(
                f"{path}: names no condition to judge its examples by (condition: ...); "
                "name a watch to use its judge's"
            )
        # The first model; run_eval swaps in each --model in turn.
        return JudgeConfig(condition=file.condition, model=args.model[0], **_endpoint(args))

    paths = [Path(p) for p in args.examples or [config_file.parent / "evals"]]
    return _sets(paths, args.split, judge, watch=None)


def _endpoint(args: argparse.Namespace) -> dict[str, Any]:
    update: dict[str, Any] = {}
    if args.base_url:
        update["base_url"] = args.base_url
    if args.api_key_env:
        update["api_key_env"] = args.api_key_env
    return update


def _sets(
    paths: list[Path],
    split: str,
    judge: Callable[[Path, ExamplesFile], JudgeConfig],
    *,
    watch: str | None,
) -> list[EvalSet]:
    from changewatch.evaluators.eval_run import EvalSet
    from changewatch.evaluators.evals import EvalError, example_files, load_examples_file

    sets = []
    for path in example_files(paths):
        file = load_examples_file(path)
        examples = [e for e in file.examples if split == "all" or e.split == split]
        if not examples:
            raise EvalError(f"{path}: no examples with split: {split}")
        sets.append(
            EvalSet(
                name=path.stem,
                watch=watch or path.stem,
                judge=judge(path, file),
                examples=examples,
                path=path,
            )
        )
    return sets


def _below(models: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """A line for each model below ``--min-agreement`` or ``--min-f1`` over all its examples."""
    from changewatch.evaluators.eval_report import ALL

    lines = []
    for model in models:
        overall = model["conditions"][ALL]
        for option, key, label in (
            (args.min_agreement, "agreement", "agreement"),
            (args.min_f1, "f1", "F1"),
        ):
            value = overall[key]
            if option is not None and (value or 0.0) < option:
                shown = "none" if value is None else f"{value:.2f}"
                lines.append(f"model {model['model']!r}: {label} {shown} is below {option:.2f}")
    return lines


def _print_text(sets: list[EvalSet], results_path: Path, models: list[dict[str, Any]]) -> None:
    from changewatch.evaluators.eval_report import format_report

    for eval_set in sets:
        print(f"{eval_set.name}: {len(eval_set.examples)} example(s) from {eval_set.path}")
    print()
    print(format_report(models))
    print(f"\nresults: {results_path}")


def _as_json(
    sets: list[EvalSet],
    split: str,
    results_path: Path,
    models: list[dict[str, Any]],
    problems: list[str],
) -> dict[str, Any]:
    return {
        "split": split,
        "examples": {
            s.name: {
                "file": str(s.path),
                "examples": len(s.examples),
                "condition": s.judge.condition,
            }
            for s in sets
        },
        "results": str(results_path),
        "models": models,
        "problems": problems,
    }
