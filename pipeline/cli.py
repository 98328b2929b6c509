"""The `changewatch` command: demo, sync and deliver, digests, SQL, config checks."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from changewatch.pipeline.assets import FULL_TAG, SILENT_TAG
from changewatch.pipeline.config import ChangewatchConfig, ConfigError, config_path, load_config
from changewatch.pipeline.maintenance import RETENTION_ASSET
from changewatch.pipeline.resources import WAREHOUSE_URL_ENV
from changewatch.pipeline.runner import instance, locations, materialize, sync_source

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="changewatch", description=__doc__)
    parser.add_argument(
        "--config", help="watches file (default: $CHANGEWATCH_CONFIG or watches.yaml)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="start the demo API, sync, evaluate and notify, change it, run again"
    )
    demo.add_argument("--issues", type=int, default=40, help="issues in the demo tracker")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--update", type=int, default=3, help="issues to edit between runs")
    demo.add_argument("--delete", type=int, default=1, help="issues to delete between runs")
    demo.add_argument("--create", type=int, default=2, help="issues to open between runs")
    demo.add_argument("--keep", action="store_true", help="keep earlier demo data")

    sync = commands.add_parser(
        "sync", help="sync sources now (all, or the ones named), evaluate and deliver"
    )
    sync.add_argument("sources", nargs="*")
    sync.add_argument(
        "--silent", action="store_true", help="record changes without telling watches (backfill)"
    )
    sync.add_argument(
        "--full",
        action="store_true",
        help="walk the complete listing: vanished objects become deletes (reconciliation)",
    )

    release = commands.add_parser(
        "release", help="hand changes held by the change-storm guard to the watches"
    )
    release.add_argument("source")
    release.add_argument("--discard", action="store_true", help="mark them silent instead")

    digest = commands.add_parser("digest", help="send one day's digest (default: yesterday)")
    digest.add_argument("name")
    digest.add_argument("--day", type=date.fromisoformat, help="YYYY-MM-DD in the digest's zone")
    digest.add_argument(
        "--partial",
        action="store_true",
        help="send the day so far and leave it open (its whole digest still goes out later)",
    )

    api = commands.add_parser("demo-api", help="serve the demo API until Ctrl-C")
    api.add_argument("--port", type=int, default=8765)
    api.add_argument("--issues", type=int, default=40)
    api.add_argument("--seed", type=int, default=7)

    commands.add_parser("validate", help="load and check the watches file")
    commands.add_parser(
        "info", help="say which watches file, Dagster instance and warehouse the commands use"
    )
    commands.add_parser("prune", help="apply the retention settings now")

    query = commands.add_parser("sql", help="run a read-only SQL query on the warehouse")
    query.add_argument("query")

    args = parser.parse_args(argv)
    try:
        if args.command == "sql":
            return _sql(args.query)
        if args.command == "demo-api":
            from changewatch.sources.demo.server import main as serve

            serve(
                ["--port", str(args.port), "--issues", str(args.issues), "--seed", str(args.seed)]
            )
            return 0
        if args.command == "demo":
            from changewatch.pipeline.demo import run_demo

            return run_demo(args)
        if args.command == "info":
            return _info(args.config)
        config = load_config(args.config)
        if args.command == "validate":
            return _validate(config)
        if args.command == "digest":
            return _digest(config, args.name, args.day, partial=args.partial)
        if args.command == "release":
            return _release(config, args.source, discard=args.discard)
        if args.command == "prune":
            return _prune(config)
        return _sync(config, args.sources, silent=args.silent, full=args.full)
    except ConfigError as error:
        print(f"changewatch: invalid config\n{error}", file=sys.stderr)
        return 2


def _validate(config: ChangewatchConfig) -> int:
    print(
        f"ok: {len(config.sources)} source(s), {len(config.watches)} watch(es), "
        f"{len(config.channels)} channel(s), {len(config.digests)} digest(s)"
    )
    return 0


def _info(path: str | None) -> int:
    config = config_path(path).resolve()
    print(f"watches file: {config}" + ("" if config.is_file() else " (missing)"))
    print(locations(instance()))
    return 0


def _sql(query: str) -> int:
    import polars as pl
    from changewatch.warehouse import connect

    with connect(os.environ.get(WAREHOUSE_URL_ENV)) as wh:
        frame = wh.fetch_frame(query)
    with pl.Config(tbl_rows=50, tbl_cols=20, fmt_str_lengths=40, tbl_width_chars=160):
        print(frame)
    return 0


def _release(config: ChangewatchConfig, source: str, *, discard: bool) -> int:
    from changewatch.warehouse import connect
    from changewatch.warehouse.sync import release_changes

    with connect(os.environ.get(WAREHOUSE_URL_ENV)) as wh:
        count = release_changes(wh, config.source(source), discard=discard)
    what = "discarded (marked silent)" if discard else "released to the watches"
    print(f"{source}: {count} held change(s) {what}")
    return 0


def _prune(config: ChangewatchConfig) -> int:
    if not config.retention.enabled:
        print("changewatch: no retention is configured (see `retention:` in the README)")
        return 2
    for asset, meta in materialize(config, [RETENTION_ASSET], instance()).items():
        print(summarize(asset, meta))
    return 0


def _sync(config: ChangewatchConfig, names: Sequence[str], *, silent: bool, full: bool) -> int:
    names = list(names) or [s.name for s in config.sources]
    tags = {}
    # The sync asset reads these run tags: a backfill or a sweep is a property of the run.
    if silent:
        tags[SILENT_TAG] = "true"
    if full:
        tags[FULL_TAG] = "true"
    dagster = instance()
    print(locations(dagster))
    # One run of each source's job, as the sensor requests them.
    for name in names:
        for asset, meta in sync_source(config, name, dagster, tags=tags).items():
            print(summarize(asset, meta))
    return 0


def _digest(config: ChangewatchConfig, name: str, day: date | None, *, partial: bool) -> int:
    from changewatch.pipeline.digests import send_day

    digest = next((d for d in config.digests if d.name == name), None)
    if digest is None:
        print(f"changewatch: no digest {name!r}", file=sys.stderr)
        return 2
    if day is None:
        day = datetime.now(ZoneInfo(digest.timezone)).date() - timedelta(days=1)
    try:
        meta = send_day(config, digest, day, partial=partial)
    except ValueError as refused:  # the day is not over, or before the digest's start
        print(f"changewatch: {refused}", file=sys.stderr)
        return 1
    print(summarize(f"digest_{name}", meta))
    return 0


def summarize(asset: str, meta: dict) -> str:
    """One line per materialized asset, from its metadata."""
    if "rows_fetched" in meta:
        line = (
            f"{asset}: fetched {meta['rows_fetched']} rows in {meta['pages']} page(s) -> "
            f"{meta['inserted']} inserted, {meta['updated']} updated, {meta['deleted']} deleted, "
            f"{meta['unchanged']} unchanged ({meta['duration_s']:.2f}s)"
        )
        if meta.get("not_modified"):
            line += "; not modified (every request answered 304)"
        if meta.get("silent"):
            line += "; recorded silently (baseline or backfill)"
        if meta.get("schema_drift"):
            line += f"; new payload fields: {meta['schema_drift']}"
        if meta.get("storm_held"):
            line += "; CHANGE STORM: its changes are held until `changewatch release`"
        return line
    if "changes_read" in meta:
        return (
            f"{asset}: {meta['changes_read']} change(s) read, {meta['passed_filter']} passed "
            f"the filter, {meta['judged']} judged ({meta['judge_cache_hits']} cached), "
            f"{meta['notified']} notified, {meta['suppressed_duplicates']} duplicate(s), "
            f"{meta['held']} held"
            + (
                f"; the filter FAILED on {meta['filter_errors']} change(s), held (see the run's "
                "warnings and evaluations.filter_error)"
                if meta.get("filter_errors")
                else ""
            )
        )
    if "sent" in meta:
        return (
            f"{asset}: {meta['sent']} delivered, {meta['retrying']} to retry, "
            f"{meta['dead_lettered']} dead-lettered"
        )
    if "changes_deleted" in meta:
        return (
            f"{asset}: {meta['changes_deleted']} change(s) and {meta['evaluations_deleted']} "
            f"evaluation(s) deleted, {meta['sync_runs_deleted']} sync run record(s) deleted, "
            f"{meta['notifications_cleared']} notification(s) cleared, "
            f"{meta['verdicts_deleted']} cached verdict(s) deleted"
        )
    if "status" in meta:
        files = f" -> {meta['files']}" if meta.get("files") else ""
        so_far = " so far (partial: the day stays open)" if meta.get("partial") else ""
        return f"{asset}: {meta['status']}{so_far}, {meta['items']} item(s){files}"
    return f"{asset}: {meta}"


if __name__ == "__main__":
    raise SystemExit(main())
