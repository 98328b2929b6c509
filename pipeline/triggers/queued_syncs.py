"""Which sources already wait in a queued sync run: the sensors ask no second run for them.

A run that has not begun its sync will fetch the source's state as it is when it begins, so a
second run asked for the same source meanwhile only repeats that fetch. When syncs are asked
faster than the workers run them (a bad day: a slow API, a worker host lost, more sources than
the workers can take), asking again at every slot queued one more run per tick, a queue that
only grew and that every change then waited behind (bench/README.md, "a queue that stops
growing"). One query of the instance's not-begun runs per tick; a run of one source names it
in a tag, a batched run in its config (pipeline/assets/batched_syncs.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
from changewatch.pipeline.assets.batched_syncs import batch_sources
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG

__all__ = ["NOT_BEGUN", "queued_sources"]

# A run in these has not begun its sync.
NOT_BEGUN = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]


def queued_sources(
    instance: dg.DagsterInstance, names: Iterable[str], tags: dict[str, str] | None = None
) -> set[str]:
    """Those of ``names`` with a sync run (with ``tags``, if given) queued and not started."""
    wanted = set(names)
    if not wanted:
        return set()
    runs = instance.get_runs(dg.RunsFilter(statuses=NOT_BEGUN, tags=tags or {}))
    found: set[str] = set()
    for run in runs:
        source = run.tags.get(SOURCE_TAG)
        found.update([source] if source else batch_sources(run.run_config))
    return found & wanted
