"""The learned judge stages in Dagster: an asset per watch that has one, retraining it.

Materializing ``learned_<watch>`` does what ``changewatch train WATCH`` does
(pipeline/train_command.py): retrain from the labels so far, keep the new model only if it
scores no worse on held-out labels. Its line is the run's metadata, so the UI shows each
retraining, refusals included, and a backfill is one more materialization.
"""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import dagster as dg
from changewatch.evaluators.config import LEARNED_MODEL
from changewatch.pipeline.config import ChangewatchConfig
from changewatch.pipeline.locations import config_path
from changewatch.pipeline.resources import WarehouseResource
from changewatch.pipeline.train_command import train_watch
from dagster import AssetExecutionContext

__all__ = ["learned_assets"]


def learned_assets(config: ChangewatchConfig) -> list[dg.AssetsDefinition]:
    """One training asset per watch whose judge has a `model: learned` stage."""
    return [
        _asset(config, watch.name)
        for watch in config.watches
        if watch.judge is not None
        and any(judge.model == LEARNED_MODEL for judge in watch.judge.judges())
    ]


def _asset(config: ChangewatchConfig, name: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"learned_{name}",
        group_name="learning",
        kinds={"python"},
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
