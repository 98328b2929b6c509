"""`changewatch train WATCH`: retrain the watch's learned judge stage from its labels.

The labels are the watch's rated notifications (feedback), its examples file
(evals/<watch>.yaml beside the watches file, if there) and its served judge's stored verdicts;
evaluators/learned_training.py trains and decides whether the new model replaces the one in
use. The CLI prints its one line.
"""

from __future__ import annotations

import argparse
from typing import Any

from changewatch.pipeline.errors import UsageError

__all__ = ["add_parser", "run", "train_watch"]


def add_parser(commands: Any) -> None:
    """The `train` subcommand."""
    train = commands.add_parser(
        "train", help="retrain a watch's learned judge stage from its labels and verdicts"
    )
    train.add_argument("watch", help="the watch's name in the watches file")


def learned_stage(watch: Any) -> Any:
    """The watch's judge config of model `learned`; UsageError when it has none."""
    from changewatch.evaluators.config import LEARNED_MODEL

    judges = watch.judge.judges() if watch.judge is not None else []
    for judge in judges:
        if judge.model == LEARNED_MODEL:
            return judge
    raise UsageError(
        f"watch {watch.name!r} has no learned stage: name it first in its judge "
        "(judge: [{model: learned, condition: ...}, {model: ..., when: unsure}])"
    )


def train_watch(wh: Any, config_file: Any, watch: Any) -> str:
    """Train ``watch``'s learned stage from the labels in warehouse ``wh`` and the examples
    file beside ``config_file``; the line saying what came of it."""
    from changewatch.evaluators.evals import examples_path, load_examples
    from changewatch.evaluators.feedback import export_examples
    from changewatch.warehouse.schema import ensure_evaluation_tables
    from changewatch.warehouse.statements import render

    stage = learned_stage(watch)
    try:
        from changewatch.evaluators import learned, learned_training
    except ModuleNotFoundError:
        from changewatch.evaluators.learned_features import INSTALL_HINT

        raise UsageError(INSTALL_HINT) from None
    examples = []
    path = examples_path(config_file, watch.name)
    if path.is_file():
        examples = list(load_examples(path))  # EvalError names the file and example
    with wh.transaction():
        ensure_evaluation_tables(wh)
    examples += export_examples(wh, watch.name)
    served = wh.fetch(render("select_served_verdict_prompts", wh.dialect), (watch.name,))
    labels = learned_training.labels_of(
        watch.name, examples, served, min_confidence=watch.judge.min_confidence
    )
    return learned_training.train(
        watch.name, labels, learned.model_file(stage), threshold=stage.threshold
    )


def run(args: argparse.Namespace) -> int:
    from changewatch.pipeline.cli import _known
    from changewatch.pipeline.config import load_config
    from changewatch.pipeline.locations import config_path
    from changewatch.warehouse import connect

    config = load_config(args.config)
    _known("watch", args.watch, [w.name for w in config.watches])
    with connect() as wh:
        print(train_watch(wh, config_path(args.config), config.watch(args.watch)))
    return 0
