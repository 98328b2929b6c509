"""`changewatch train WATCH`: retrain the watch's learned judge stage from its labels.

The labels are the watch's rated notifications (feedback), its examples file
(evals/<watch>.yaml beside the watches file, if there) and its served judge's stored verdicts;
evaluators/learned_training.py trains and decides whether the new model replaces the one in
use. The CLI prints its one line.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """The `train` subcommand."""
    train = commands.add_parser(
        "train", help="retrain a watch's learned judge stage from its labels and verdicts"
    )
    train.add_argument("watch", help="the watch's name in the watches file")


def run(args: argparse.Namespace) -> int:
    # Imported here: it loads Dagster, which `changewatch --help` must not pay for.
    from changewatch.pipeline.assets.learned_assets import train_watch
    from changewatch.pipeline.cli.command_line import _known
    from changewatch.pipeline.project.storage_paths import config_path
    from changewatch.pipeline.project.watches_file import load_config
    from changewatch.warehouse import connect

    config = load_config(args.config)
    _known("watch", args.watch, [w.name for w in config.watches])
    with connect() as wh:
        print(train_watch(wh, config_path(args.config), config.watch(args.watch)))
    return 0
