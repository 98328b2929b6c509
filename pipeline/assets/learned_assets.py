"""The learned judge stages in Dagster: an asset per watch that has one, retraining it.

Materializing ``learned_<watch>`` does what ``changewatch train WATCH`` does
(pipeline/cli/train_command.py): retrain from the labels so far, keep the new model only if it
scores no worse on held-out labels. Its line is the run's metadata, so the UI shows each
retraining, refusals included, and a backfill is one more materialization.
"""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

from typing import Any

import dagster as dg
from changewatch.evaluators.config import LEARNED_MODEL
from changewatch.pipeline.project.expected_errors import UsageError
from changewatch.pipeline.project.storage_paths import config_path
from changewatch.pipeline.project.warehouse_resource import WarehouseResource, warehouse_pool
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from dagster import AssetExecutionContext

__all__ = ["learned_assets", "learned_schedules", "learned_stage", "train_watch"]


def learned_assets(config: ChangewatchConfig, *, warehouse_url: str) -> list[dg.AssetsDefinition]:
    """One training asset per watch whose judge has a `model: learned` stage."""
    return [
        _asset(config, watch.name, warehouse_url)
        for watch in config.watches
        if _stage_of(watch) is not None
    ]


def _stage_of(watch: Any) -> Any:
    """The watch's judge config of model `learned`, or None."""
    judges = watch.judge.judges() if watch.judge is not None else []
    return next((judge for judge in judges if judge.model == LEARNED_MODEL), None)


def _asset(config: ChangewatchConfig, name: str, warehouse_url: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"learned_{name}",
        group_name="learning",
        kinds={"python"},
        # It only reads the warehouse (labels, served verdicts), but no process can open a
        # DuckDB file while another writes it: it takes the writers' slot like they do.
        pool=warehouse_pool(warehouse_url, "learning", name),
        description=(
            f"Retrains watch {name}'s learned judge stage from its ratings, examples and served "
            "verdicts; a new model is used only if it scores no worse on held-out labels."
        ),
    )
    def _train(
        context: AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        with warehouse.connect() as wh:
            line = train_watch(wh, config_path(), config.watch(name))
        context.log.info(line)
        return dg.MaterializeResult(metadata={"outcome": line})

    return _train


def learned_schedules(
    config: ChangewatchConfig,
) -> "tuple[list[dg.UnresolvedAssetJobDefinition], list[dg.ScheduleDefinition]]":
    """A job and a running schedule per learned stage with a ``retrain`` cron: ratings change
    what the watch sends without anyone running `changewatch train`."""
    jobs, schedules = [], []
    for watch in config.watches:
        stage = _stage_of(watch)
        if stage is None or stage.retrain is None:
            continue
        job = dg.define_asset_job(
            f"train_{watch.name}",
            selection=dg.AssetSelection.assets(f"learned_{watch.name}"),
            executor_def=dg.in_process_executor,
            description=f"Retrain watch {watch.name}'s learned judge stage.",
        )
        jobs.append(job)
        schedules.append(
            dg.ScheduleDefinition(
                name=f"train_{watch.name}_schedule",
                cron_schedule=stage.retrain,
                execution_timezone="UTC",
                job=job,
                default_status=dg.DefaultScheduleStatus.RUNNING,
                description=(
                    f"Retrains watch {watch.name}'s learned stage on cron '{stage.retrain}' "
                    "(UTC); a new model is used only if it scores no worse on held-out labels."
                ),
            )
        )
    return jobs, schedules


def learned_stage(watch: Any) -> Any:
    """The watch's judge config of model `learned`; UsageError when it has none."""
    if (stage := _stage_of(watch)) is not None:
        return stage
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
        watch.name, labels, learned.model_file(stage), threshold=stage.threshold,
        condition=stage.condition,
    )
