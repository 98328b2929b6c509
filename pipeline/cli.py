"""The ``changewatch`` command: run the demo, sync sources, serve the demo API, check config."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from pipeline.assets import SOURCE_TAG
from pipeline.config import ConfigError, WatchConfig, load_config
from pipeline.resources import WAREHOUSE_URL_ENV
from pipeline.wiring import build_definitions

__all__ = ["main"]

DEMO_URL_ENV = "CHANGEWATCH_DEMO_URL"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="changewatch", description=__doc__)
    parser.add_argument(
        "--config", help="watches file (default: $CHANGEWATCH_CONFIG or watches.yaml)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="start the demo API, sync it, change it, sync again")
    demo.add_argument("--issues", type=int, default=40, help="issues in the demo tracker")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--update", type=int, default=3, help="issues to edit between syncs")
    demo.add_argument("--delete", type=int, default=1, help="issues to delete between syncs")
    demo.add_argument("--create", type=int, default=2, help="issues to open between syncs")
    demo.add_argument("--keep", action="store_true", help="keep earlier demo data")

    sync = commands.add_parser("sync", help="sync sources now (all, or the ones named)")
    sync.add_argument("sources", nargs="*")

    api = commands.add_parser("demo-api", help="serve the demo API until Ctrl-C")
    api.add_argument("--port", type=int, default=8765)
    api.add_argument("--issues", type=int, default=40)
    api.add_argument("--seed", type=int, default=7)

    commands.add_parser("validate", help="load and check the watches file")

    query = commands.add_parser("sql", help="run a read-only SQL query on the warehouse")
    query.add_argument("query")

    args = parser.parse_args(argv)
    try:
        if args.command == "sql":
            return _sql(args.query)
        if args.command == "demo-api":
            return _serve_demo_api(args)
        if args.command == "demo":
            return _demo(args)
        config = load_config(args.config)
        if args.command == "validate":
            print(
                f"ok: {len(config.sources)} source(s): {', '.join(s.name for s in config.sources)}"
            )
            return 0
        return _sync(config, args.sources)
    except ConfigError as error:
        print(f"changewatch: invalid config\n{error}", file=sys.stderr)
        return 2


def _sql(query: str) -> int:
    import polars as pl

    from warehouse import connect

    with connect(os.environ.get(WAREHOUSE_URL_ENV)) as wh:
        frame = wh.fetch_frame(query)
    with pl.Config(tbl_rows=50, tbl_cols=20, fmt_str_lengths=40, tbl_width_chars=160):
        print(frame)
    return 0


def _instance() -> dg.DagsterInstance:
    # Runs launched here are recorded where `dagster dev` will show them: DAGSTER_HOME, which
    # defaults to this folder when it holds the project's dagster.yaml.
    if not os.environ.get("DAGSTER_HOME") and Path("dagster.yaml").is_file():
        os.environ["DAGSTER_HOME"] = str(Path.cwd())
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def _materialize(config: WatchConfig, names: Sequence[str], instance: dg.DagsterInstance) -> list:
    defs = build_definitions(config)
    tables = [config.source(name).table for name in names]
    assets = [a for a in defs.assets if a.key.path[-1] in tables]  # type: ignore[union-attr]
    result = dg.materialize(
        assets,
        resources=defs.resources,
        instance=instance,
        tags={SOURCE_TAG: ",".join(names)},
        # The CLI prints its own summary; Dagster's step-by-step log stays in the run's record.
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        raise_on_error=True,
    )
    stats = []
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        meta = {k: v.value for k, v in materialization.metadata.items()}
        stats.append((materialization.asset_key.path[-1], meta))
    return stats


def _sync(config: WatchConfig, names: Sequence[str]) -> int:
    names = list(names) or [s.name for s in config.sources]
    for table, meta in _materialize(config, names, _instance()):
        print(_summary(table, meta))
    return 0


def _summary(table: str, meta: dict) -> str:
    return (
        f"{table}: fetched {meta['rows_fetched']} rows in {meta['pages']} page(s) -> "
        f"{meta['inserted']} inserted, {meta['updated']} updated, {meta['deleted']} deleted, "
        f"{meta['unchanged']} unchanged ({meta['duration_s']:.2f}s)"
    )


def _demo(args: argparse.Namespace) -> int:
    from sources.demo import DemoAPIServer, DemoTracker
    from warehouse import connect, describe_url
    from warehouse.backends import DEFAULT_URL, duckdb_path
    from warehouse.schema import changes_table
    from warehouse.statements import quote, render

    tracker = DemoTracker(issues=args.issues, seed=args.seed)
    with DemoAPIServer(tracker) as server:
        os.environ[DEMO_URL_ENV] = server.url
        config = load_config(args.config)
        source = config.sources[0]
        url = os.environ.get(WAREHOUSE_URL_ENV) or DEFAULT_URL
        print(f"demo API serving {args.issues} issues at {server.url}")
        if not args.keep:
            _reset_demo_tables(url, source.name, source.table)
        instance = _instance()

        def sync_and_show(title: str, since_change: int) -> None:
            print(f"\n== {title}")
            for table, meta in _materialize(config, [source.name], instance):
                print(_summary(table, meta))
            with connect(url) as wh:
                changes = quote(changes_table(source.table))
                rows = wh.fetch_frame(
                    render("select_changes_since", wh.dialect, changes=changes), (since_change,)
                ).rows(named=True)
            for row in rows[:12]:
                print("  " + _describe_change(row, source.primary_key[0], source.updated_at))
            if len(rows) > 12:
                print(f"  ... and {len(rows) - 12} more")

        sync_and_show("first sync: every issue is new", _last_change(url, source.table))
        sync_and_show("second sync, nothing changed upstream", _last_change(url, source.table))
        mutation = tracker.mutate(create=args.create, update=args.update, delete=args.delete)
        print(
            f"\ndemo API changed: opened {mutation['created']}, edited {mutation['updated']}, "
            f"deleted {mutation['deleted']}"
        )
        sync_and_show("third sync, after the changes", _last_change(url, source.table))

    where = duckdb_path(url).resolve() if url.startswith("duckdb") else describe_url(url)
    print(f"\nwarehouse: {where}")
    print(f"tables: {source.table} (current rows), {source.table}_changes (change log),")
    print("        sync_state (cursors), sync_runs (one row per sync)")
    query = f"SELECT kind, object_key, changed_columns FROM {changes_table(source.table)}"
    print(f"query it: changewatch sql '{query}'")
    print("open the Dagster UI: DAGSTER_HOME=$PWD dagster dev -w workspace.yaml")
    return 0


def _describe_change(row: dict, key: str, updated_at: str | None) -> str:
    """One line per change: kind, key, and for updates what went from what to what."""
    text = f"#{row['change_id']:<5} {row['kind']:<7} {key}={row['object_key']:<6}"
    if row["kind"] == "update":
        edits = [
            f"{c}: {row['old_' + c]!r} -> {row['new_' + c]!r}"
            for c in row["changed_columns"]
            if c != updated_at
        ]
        text += " " + "; ".join(edits)
    elif row["kind"] == "insert":
        text += f" {row.get('new_title')!r}" if "new_title" in row else ""
    return text


def _last_change(url: str, table: str) -> int:
    from warehouse import connect

    with connect(url) as wh:
        present = wh.fetch(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = $1",
            (f"{table}_changes",),
        )[0][0]
        if not present:
            return 0
        return wh.fetch(f'SELECT coalesce(max(change_id), 0) FROM "{table}_changes"')[0][0]


def _reset_demo_tables(url: str, source: str, table: str) -> None:
    """Forget earlier demo runs, so the demo tells the same story every time."""
    from warehouse import connect

    with connect(url) as wh, wh.transaction():
        wh.execute(f'DROP TABLE IF EXISTS "{table}"')
        wh.execute(f'DROP TABLE IF EXISTS "{table}_changes"')
        wh.execute(f'DROP SEQUENCE IF EXISTS "{table}_changes_seq"')
        for bookkeeping in ("sync_state", "sync_runs"):
            present = wh.fetch(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = $1",
                (bookkeeping,),
            )[0][0]
            if present:
                wh.execute(f"DELETE FROM {bookkeeping} WHERE source = $1", (source,))


def _serve_demo_api(args: argparse.Namespace) -> int:
    from sources.demo.server import main as serve

    return (
        serve(["--port", str(args.port), "--issues", str(args.issues), "--seed", str(args.seed)])
        or 0
    )


if __name__ == "__main__":
    raise SystemExit(main())
