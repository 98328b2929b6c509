"""`changewatch demo`: the whole path on the bundled demo API, told as a story on stdout."""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from changewatch.channels.outbox import DigestWindowOpen
from changewatch.pipeline.cli import summarize
from changewatch.pipeline.config import load_config
from changewatch.pipeline.digests import send_day
from changewatch.pipeline.resources import WAREHOUSE_URL_ENV
from changewatch.pipeline.runner import instance, materialize, source_job_assets, sync_tags
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import describe_url
from changewatch.warehouse.backends import duckdb_path

__all__ = ["DEMO_URL_ENV", "DEMO_WAREHOUSE", "run_demo"]

DEMO_URL_ENV = "CHANGEWATCH_DEMO_URL"
# The demo keeps its own warehouse file, so it can start from a clean slate every time
# without touching the data of real sources.
DEMO_WAREHOUSE = "duckdb:///.changewatch/demo.duckdb"


def run_demo(args: argparse.Namespace) -> int:
    url = os.environ.get(WAREHOUSE_URL_ENV) or DEMO_WAREHOUSE
    os.environ[WAREHOUSE_URL_ENV] = url
    if url == DEMO_WAREHOUSE and not args.keep:
        for leftover in Path(".changewatch").glob("demo.duckdb*"):
            leftover.unlink()
    tracker = DemoTracker(issues=args.issues, seed=args.seed)
    with DemoAPIServer(tracker) as server:
        os.environ[DEMO_URL_ENV] = server.url
        config = load_config(args.config)
        source = config.sources[0]
        dagster = instance()
        print(f"demo API: {args.issues} issues of acme/widgets at {server.url}")

        def run(title: str) -> None:
            print(f"\n== {title}")
            results = materialize(
                config,
                source_job_assets(config, [source.name]),
                dagster,
                tags=sync_tags([source.name]),
            )
            for asset, meta in results.items():
                print(summarize(asset, meta))
            for watch in config.watches:
                meta = results.get(f"eval_{watch.name}", {})
                if watch.judge and meta.get("held"):
                    print(
                        f"   note: {meta['held']} change(s) of {watch.name} are held: no model "
                        f"answered at {watch.judge.base_url} (model {watch.judge.model}). They "
                        "are judged on a later run; see the README to point the judge at "
                        "Ollama, vLLM, llama.cpp or OpenAI."
                    )

        run("first run: every issue is new, so every watch sees every issue")
        run("second run, nothing changed upstream: nothing new to evaluate or send")
        mutation = tracker.mutate(create=args.create, update=args.update, delete=args.delete)
        print(
            f"\ndemo API changed: opened {mutation['created']}, edited {mutation['updated']}, "
            f"deleted {mutation['deleted']}"
        )
        run("third run, after the changes: only those changes are evaluated")

        for digest in config.digests:
            # Today is not over: its digest, sent once per day, would miss what comes later.
            # The demo shows the day so far, which leaves the day open.
            today = datetime.now(ZoneInfo(digest.timezone)).date()
            print(f"\n== digest {digest.name} for {today}, so far (a partial digest)")
            meta = send_day(config, digest, today, partial=True)
            print(summarize(f"digest_{digest.name}", meta))
            try:
                send_day(config, digest, today, dagster_instance=dagster)
            except DigestWindowOpen as refused:
                print(f"the whole day: not sent yet: {refused}")

    where = duckdb_path(url).resolve() if url.startswith("duckdb") else describe_url(url)
    print(f"\nwarehouse: {where}")
    print(f"tables: {source.table} (current rows), {source.table}_changes (change log),")
    print("        evaluations, outbox, deliveries, digests, sync_state, sync_runs")
    for channel in config.channels:
        if channel.type == "file":
            print(f"notifications file: {Path(channel.path).resolve()}")
    print(
        f"query it: CHANGEWATCH_WAREHOUSE_URL={url} changewatch sql "
        "'SELECT watch, title FROM outbox'"
    )
    print(
        f"open the Dagster UI: CHANGEWATCH_WAREHOUSE_URL={url} DAGSTER_HOME=$PWD "
        "dagster dev -w workspace.yaml"
    )
    return 0
