"""`changewatch resume NAME`: resume a source or watch that one of its stop conditions paused.

The pause lives in the Dagster instance (pipeline/polling/source_pauses.py), so this needs neither
the warehouse nor a running daemon: the sync sensor sees the source resumed at its next tick and
probes it at once, afresh (its failures forgotten, its envelope at its start interval).
Notifications are counted from now on for ``after_notifications``. A source or watch past its
``stop.until`` is refused: it would only be paused again.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from changewatch.pipeline.project.expected_errors import UsageError

if TYPE_CHECKING:
    from changewatch.pipeline.project.watches_file import ChangewatchConfig

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """The `resume` subcommand."""
    resume = commands.add_parser(
        "resume", help="resume a source or watch that a stop condition paused"
    )
    resume.add_argument("name", help="the source's or watch's name in the watches file")


def run(config: ChangewatchConfig, name: str, *, now: float | None = None) -> int:
    """Resume ``name`` (a source, a watch, or both if they share it); one line each."""
    import dagster as dg
    from changewatch.pipeline.assets.watch_assets import evaluation_asset_name
    from changewatch.pipeline.cli.in_process_runs import instance
    from changewatch.pipeline.polling.source_pauses import resume
    from changewatch.pipeline.project.storage_paths import dagster_home

    now = time.time() if now is None else now
    found: list[tuple[str, Any, dg.AssetKey]] = [
        ("source", s, dg.AssetKey(s.table)) for s in config.sources if s.name == name
    ]
    found += [
        ("watch", w, dg.AssetKey(evaluation_asset_name(w)))
        for w in config.watches
        if w.name == name
    ]
    if not found:
        known = ", ".join([s.name for s in config.sources] + [w.name for w in config.watches])
        raise UsageError(
            f"no source or watch {name!r} in the watches file (known: {known or 'none'})"
        )
    for kind, item, _ in found:
        deadline = item.stop.deadline()
        if deadline is not None and now >= deadline:
            when = datetime.fromtimestamp(deadline, UTC).isoformat()
            raise UsageError(
                f"{kind} {name}: its stop.until ({when}) has passed, so it would be paused "
                "again: change or remove stop.until in the watches file first"
            )
    if dagster_home() is None:
        # An ephemeral instance holds no pauses: saying "not paused" would mislead.
        raise UsageError(
            "no Dagster instance to resume in: set DAGSTER_HOME to the folder of the "
            "instance the sensor runs with (or run this where its dagster.yaml is)"
        )
    dagster_instance = instance()
    for kind, _, asset in found:
        was = resume(dagster_instance, kind, name, asset=asset, now=now)
        if was is None:
            print(f"{kind} {name}: not paused")
        else:
            since = datetime.fromtimestamp(was.at, UTC).isoformat(timespec="seconds")
            print(f"{kind} {name}: resumed (paused since {since}: {was.reason})")
    return 0
