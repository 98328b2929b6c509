"""The `changewatch` command: demo, sync and deliver, digests, SQL, config checks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

from changewatch.pipeline.project.expected_errors import UsageError, explain, redact

if TYPE_CHECKING:
    from changewatch.pipeline.project.watches_file import ChangewatchConfig

__all__ = ["main"]

# Only argparse and the errors module load before a command runs: Dagster, polars and DuckDB
# take seconds to import, and `changewatch --help` or a typo should not wait for them.


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _log_to_stderr(debug=args.debug)
    # The one error boundary: an expected failure is one line (after whatever summary the
    # command printed) and a non-zero exit; --debug adds the traceback.
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("changewatch: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - every error leaves through here
        return _report(error, debug=args.debug)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="changewatch", description=__doc__)
    parser.add_argument(
        "--config", help="watches file (default: $CHANGEWATCH_CONFIG or watches.yaml)"
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of a failure"
    )
    parser.add_argument(
        "--version", action=_Version, help="print the installed version of changewatch"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="start the demo API, sync, evaluate and notify, change it, run again"
    )
    demo.add_argument("--issues", type=int, default=40, help="issues in the demo tracker")
    demo.add_argument("--seed", type=int, default=7, help="random seed of the demo tracker")
    demo.add_argument("--update", type=int, default=3, help="issues to edit between runs")
    demo.add_argument("--delete", type=int, default=1, help="issues to delete between runs")
    demo.add_argument("--create", type=int, default=2, help="issues to open between runs")
    demo.add_argument(
        "--close", type=int, default=1, help="open issues to close between runs (at most all)"
    )
    demo.add_argument("--keep", action="store_true", help="keep earlier demo data")

    sync = commands.add_parser(
        "sync", help="sync sources now (all, or the ones named), evaluate and deliver"
    )
    sync.add_argument("sources", nargs="*", help="source names (default: every source)")
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
    release.add_argument("source", help="the source whose held changes to release")
    release.add_argument("--discard", action="store_true", help="mark them silent instead")

    digest = commands.add_parser("digest", help="send one day's digest (default: yesterday)")
    digest.add_argument("name", help="the digest's name in the watches file")
    digest.add_argument(
        "--day",
        type=date.fromisoformat,
        help="YYYY-MM-DD in the digest's zone (default: yesterday; with --partial, today)",
    )
    digest.add_argument(
        "--partial",
        action="store_true",
        help="send today so far and leave it open (its whole digest still goes out later)",
    )

    api = commands.add_parser("demo-api", help="serve the demo API until Ctrl-C")
    api.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default: 8765)")
    api.add_argument("--issues", type=int, default=40, help="issues in the demo tracker")
    api.add_argument("--seed", type=int, default=7, help="random seed of the demo tracker")

    commands.add_parser("validate", help="load and check the watches file")
    commands.add_parser(
        "info", help="say which watches file, Dagster instance and warehouse the commands use"
    )
    commands.add_parser("prune", help="apply the retention settings now")

    explain = commands.add_parser(
        "explain", help="say what a watch decided about each change of one object, and why"
    )
    explain.add_argument("watch", help="the watch's name in the watches file")
    explain.add_argument("key", help="the object's key (its primary key, as in object_key)")

    replay = commands.add_parser(
        "replay", help="replay a watch over stored history with an edited filter or condition"
    )
    replay.add_argument("watch", help="the watch's name in the watches file")
    replay.add_argument("--since", default="30d", help="how far back, as a duration (default: 30d)")
    replay.add_argument("--where", help="the filter to try instead of the watch's")
    replay.add_argument("--condition", help="the judge condition to try instead of the watch's")

    from changewatch.pipeline.cli import eval_command

    eval_command.add_parser(commands)

    from changewatch.pipeline.cli import resume_command

    resume_command.add_parser(commands)
    from changewatch.pipeline.cli import redeliver_command

    redeliver_command.add_parser(commands)

    from changewatch.pipeline.cli import train_command

    train_command.add_parser(commands)

    feedback = commands.add_parser(
        "feedback", help="rate a notification useful or noise (exported as eval examples)"
    )
    feedback.add_argument("notification_id", help="the notification's id (outbox)")
    feedback.add_argument("rating", choices=("useful", "noise"), help="what it was to you")
    feedback.add_argument("--note", help="why, in a few words")

    server = commands.add_parser(
        "feedback-server", help="answer the signed feedback links of notifications until Ctrl-C"
    )
    server.add_argument("--host", default="127.0.0.1", help="interface (default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=8090, help="port (default: 8090)")

    hooks = commands.add_parser(
        "webhooks", help="receive the sources' signed webhooks into the inbox until Ctrl-C"
    )
    hooks.add_argument("--host", default="127.0.0.1", help="interface (default: 127.0.0.1)")
    hooks.add_argument("--port", type=int, default=8088, help="port (default: 8088)")

    query = commands.add_parser("sql", help="run one read-only SQL statement on the warehouse")
    query.add_argument("query", help="one SELECT or WITH statement over the warehouse's tables")
    query.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        help="output format (default: table, cut to fit only when printing to a terminal)",
    )
    query.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="end the query after this long (default: 60)",
    )
    return parser


def _seconds(text: str) -> float:
    """A positive number of seconds up to 24 days (PostgreSQL's statement_timeout), for
    argparse."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 24 * 86_400:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0 and up to {24 * 86_400}, not {text!r}"
        )
    return value


class _Version(argparse.Action):
    """``--version``, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        from importlib.metadata import version

        print(f"changewatch {version('changewatch')}")
        parser.exit()


def _log_to_stderr(*, debug: bool) -> None:
    """Errors only, unless --debug: progress (retries, waits) is in the summary and the run's
    record; a failure says itself once, at the end."""
    import logging

    handler = logging.StreamHandler()
    handler.setLevel(logging.INFO if debug else logging.ERROR)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    if debug:
        logging.getLogger().setLevel(logging.INFO)


def _report(error: Exception, *, debug: bool) -> int:
    from changewatch.pipeline.project.expected_errors import RunFailed

    if isinstance(error, RunFailed):
        for asset, meta in error.results.items():  # what did run, before the failure
            print(summarize(asset, meta))
    if debug:
        import traceback

        traceback.print_exception(error, file=sys.stderr)
        if isinstance(error, RunFailed) and error.trace:
            print(redact(error.trace), file=sys.stderr)
    explained = explain(error)
    hint = ""
    if explained is None:  # a bug: still one line, the traceback on request
        message, code = f"unexpected error: {type(error).__name__}: {error}", 1
        hint = "" if debug else " (--debug shows the traceback)"
    else:
        message, code = explained
    first, *rest = redact(message).splitlines() or [""]
    print(f"changewatch: {first}" + ("" if rest else hint), file=sys.stderr)
    for line in rest:  # an invalid config: one line per problem
        print(line, file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    if args.command == "sql":
        from changewatch.pipeline.cli.sql_command import run_query

        run_query(args.query, fmt=args.format, timeout=args.timeout)
        return 0
    if args.command == "demo-api":
        from changewatch.sources.demo.server import main as serve

        return serve(
            ["--port", str(args.port), "--issues", str(args.issues), "--seed", str(args.seed)]
        )
    if args.command == "demo":
        from changewatch.pipeline.cli.demo_command import run_demo

        return run_demo(args)
    if args.command == "info":
        return _info(args.config)
    if args.command == "train":
        from changewatch.pipeline.cli import train_command

        return train_command.run(args)
    if args.command == "eval":  # loads the watches file only when it scores a watch's judge
        from changewatch.pipeline.cli import eval_command

        return eval_command.run(args)
    from changewatch.pipeline.project.watches_file import load_config

    # validate checks the webhook receiver's secrets too, which only its process needs.
    config = load_config(args.config, webhook_secrets=args.command == "validate")
    if args.command == "validate":
        return _validate(config)
    if args.command == "digest":
        return _digest(config, args.name, args.day, partial=args.partial)
    if args.command == "release":
        return _release(config, args.source, discard=args.discard)
    if args.command == "prune":
        return _prune(config)
    if args.command == "explain":
        return _explain(config, args.watch, args.key)
    if args.command == "replay":
        return _replay(config, args)
    if args.command == "resume":
        from changewatch.pipeline.cli import resume_command

        if args.channel is not None:
            if args.name is not None:
                raise UsageError("resume takes a NAME or --channel C, not both")
            return resume_command.run_channel(config, args.channel)
        if args.name is None:
            raise UsageError("resume needs a source's or watch's NAME, or --channel C")
        return resume_command.run(config, args.name)
    if args.command == "redeliver":
        from changewatch.pipeline.cli import redeliver_command

        return redeliver_command.run(config, args)
    if args.command == "feedback":
        return _feedback(args.notification_id, args.rating, args.note)
    if args.command == "feedback-server":
        return _feedback_server(config, args.host, args.port)
    if args.command == "webhooks":
        return _webhooks(config, args.host, args.port)
    return _sync(config, args.sources, silent=args.silent, full=args.full)


def _known(kind: str, name: str, names: Sequence[str]) -> None:
    """``UsageError`` naming the known ones, unless ``name`` is one of ``names``."""
    if name not in names:
        known = ", ".join(names) or "none configured"
        raise UsageError(f"no {kind} {name!r} in the watches file (known: {known})")


def _validate(config: ChangewatchConfig) -> int:
    print(
        f"ok: {len(config.sources)} source(s), {len(config.watches)} watch(es), "
        f"{len(config.channels)} channel(s), {len(config.digests)} digest(s)"
    )
    # Not a fault of the file, and the other watches run: said, not refused.
    from changewatch.pipeline.cli.shared_disk_warnings import local_file_warnings

    for line in local_file_warnings(config):
        print(f"warning: {line}")
    local = [
        w.name
        for w in config.watches
        if w.judge and any(j.model == "local" for j in w.judge.judges())
    ]
    if local:
        from changewatch.evaluators import local_model

        if (why := local_model.unavailable()) is not None:
            for name in local:
                print(f"watch {name!r} fails when evaluated until this is fixed: {why}")
    return 0


def _info(path: str | None) -> int:
    # Names the places without loading Dagster or the warehouse: it answers at once.
    from changewatch.pipeline.project.storage_paths import config_path, dagster_home, locations_line

    config = config_path(path).resolve()
    print(f"watches file: {config}" + ("" if config.is_file() else " (missing)"))
    print(locations_line(dagster_home()))
    return 0


def _release(config: ChangewatchConfig, source: str, *, discard: bool) -> int:
    from changewatch.warehouse import connect
    from changewatch.warehouse.sync import release_changes

    _known("source", source, [s.name for s in config.sources])
    with connect() as wh:
        count = release_changes(wh, config.source(source), discard=discard)
    what = "discarded (marked silent)" if discard else "released to the watches"
    print(f"{source}: {count} held change(s) {what}")
    return 0


def _explain(config: ChangewatchConfig, watch_name: str, key: str) -> int:
    from changewatch.evaluators.explain import explain_object, format_explanation
    from changewatch.warehouse import connect

    _known("watch", watch_name, [w.name for w in config.watches])
    watch = config.watch(watch_name)
    sources = {name: config.source(name) for name in watch.sources}
    with connect() as wh:
        print(format_explanation(watch, key, explain_object(wh, watch, sources, key)))
    return 0


def _replay(config: ChangewatchConfig, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from changewatch.evaluators.cascade import make_judge
    from changewatch.evaluators.filters import compile_filter
    from changewatch.evaluators.replay import format_replay, replay_watch, replayed
    from changewatch.sources.base import parse_duration
    from changewatch.warehouse import connect

    _known("watch", args.watch, [w.name for w in config.watches])
    try:
        since = datetime.now(UTC) - timedelta(seconds=parse_duration(args.since))
        watch = replayed(config.watch(args.watch), where=args.where, condition=args.condition)
    except ValueError as error:
        raise UsageError(str(error)) from None
    sources = {name: config.source(name) for name in watch.sources}
    for source in sources.values():  # a bad --where fails here, before anything runs
        compile_filter(
            watch.where, watch=watch.name, columns={c: s.type for c, s in source.columns.items()}
        )
    judge = make_judge(watch.judge) if watch.judge else None
    try:
        with connect() as wh:
            result = replay_watch(wh, watch, sources, since=since, judge=judge)
    finally:
        if judge is not None:
            judge.close()
    print(format_replay(watch, since, result))
    return 0


def _feedback(notification_id: str, rating: str, note: str | None) -> int:
    from changewatch.evaluators.feedback import record_feedback
    from changewatch.warehouse import connect

    with connect() as wh:
        watch = record_feedback(wh, notification_id, rating, note)
    print(f"{notification_id} ({watch}): recorded as {rating}")
    return 0


def _feedback_server(config: ChangewatchConfig, host: str, port: int) -> int:
    import os

    from changewatch.evaluators.feedback_server import FeedbackServer
    from changewatch.warehouse import DEFAULT_URL, describe_url

    if config.feedback is None:
        raise UsageError(
            "no `feedback:` in the watches file: notifications carry no links to answer"
        )
    server = FeedbackServer(config.feedback, host=host, port=port)
    print(
        f"feedback server on {server.url} for links to {config.feedback.url}, recording in "
        f"{describe_url(os.environ.get('CHANGEWATCH_WAREHOUSE_URL') or DEFAULT_URL)}",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.stop()
    return 0


def _webhooks(config: ChangewatchConfig, host: str, port: int) -> int:
    import logging

    from changewatch.pipeline.webhooks.webhook_inbox import open_inbox
    from changewatch.pipeline.webhooks.webhook_receiver import WebhookReceiver

    # A server's log is its output: each delivery stored or refused, one line (never a secret).
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log = logging.getLogger(WebhookReceiver.__module__)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    inbox = open_inbox()
    receiver = WebhookReceiver(config.sources, inbox=inbox, host=host, port=port)
    paths = ", ".join(f"{r.source} at {path}" for path, r in receiver.routes.items())
    print(f"receiving webhooks on {receiver.url} ({paths}); inbox {inbox.location}", flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        receiver.stop()
    return 0


def _prune(config: ChangewatchConfig) -> int:
    from changewatch.pipeline.assets.retention_assets import RETENTION_ASSET
    from changewatch.pipeline.cli.in_process_runs import instance, materialize

    if not config.retention.enabled:
        print("changewatch: no retention is configured (see `retention:` in the README)")
        return 2
    for asset, meta in materialize(config, [RETENTION_ASSET], instance()).items():
        print(summarize(asset, meta))
    return 0


def _sync(config: ChangewatchConfig, names: Sequence[str], *, silent: bool, full: bool) -> int:
    from changewatch.pipeline.assets.sync_assets import FULL_TAG, SILENT_TAG
    from changewatch.pipeline.cli.in_process_runs import (
        instance,
        locations,
        sync_source,
    )
    from changewatch.pipeline.project.expected_errors import RunFailed

    for name in names:
        _known("source", name, [s.name for s in config.sources])
    names = list(names) or [s.name for s in config.sources]
    tags = {}
    # The sync asset reads these run tags: a backfill or a sweep is a property of the run.
    if silent:
        tags[SILENT_TAG] = "true"
    if full:
        tags[FULL_TAG] = "true"
    dagster = instance()
    print(locations(dagster))
    # One sync run of each source, as the sensor requests them. A failed run (its sync, or
    # one of its watches) never stops the next source's: each says itself, the last raises.
    failures: list[RunFailed] = []
    for name in names:
        try:
            results = sync_source(config, name, dagster, tags=tags)
        except RunFailed as failure:
            results, failure.results = failure.results, {}  # printed here, not again
            failures.append(failure)
        for asset, meta in results.items():
            print(summarize(asset, meta))
    for failure in failures[:-1]:
        print(f"changewatch: {redact(str(failure))}", file=sys.stderr)
    if failures:
        raise failures[-1]
    return 0


def _digest(config: ChangewatchConfig, name: str, day: date | None, *, partial: bool) -> int:
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    from changewatch.pipeline.cli.digest_command import send_day

    _known("digest", name, [d.name for d in config.digests])
    digest = next(d for d in config.digests if d.name == name)
    if day is None:  # the day so far is today's; a whole day, the last that ended
        today = datetime.now(ZoneInfo(digest.timezone)).date()
        day = today if partial else today - timedelta(days=1)
    try:
        meta = send_day(config, digest, day, partial=partial)
    except ValueError as refused:  # the day is not over, or before the digest's start
        print(f"changewatch: {refused}", file=sys.stderr)
        return 1
    print(summarize(f"digest_{name}", meta))
    return 0


def _held_by_circuits(held: str | None) -> str:
    """``; N waiting for channel C (not open: ...)`` when channels were paused or disabled.

    >>> _held_by_circuits('{"hook": 3}')
    '; 3 waiting for channel hook (not open: see `changewatch resume --channel`)'
    """
    import json

    counts = json.loads(held) if held else {}
    return "".join(
        f"; {count} waiting for channel {name} (not open: see `changewatch resume --channel`)"
        for name, count in sorted(counts.items())
    )


def summarize(asset: str, meta: dict) -> str:
    """One line per materialized asset, from its metadata."""
    if "skipped" in meta:  # a sync that found another one of its source running
        return f"{asset}: {meta['skipped']}"
    if "rows_fetched" in meta:
        line = (
            f"{asset}: fetched {meta['rows_fetched']} rows in {meta['pages']} page(s) -> "
            f"{meta['inserted']} inserted, {meta['updated']} updated, {meta['deleted']} deleted, "
            f"{meta['unchanged']} unchanged ({meta['duration_s']:.2f}s)"
        )
        if meta.get("not_modified"):
            line += "; not modified (every request answered 304)"
        if meta.get("rows_duplicate"):
            line += f"; {meta['rows_duplicate']} repeated key(s) merged (the newest kept)"
        if meta.get("rejected"):
            line += (
                f"; {meta['rejected']} record(s) REJECTED and left out (see table "
                "rejected_records; retried next sync)"
            )
        if meta.get("silent"):
            line += "; recorded silently (baseline or backfill)"
        if meta.get("schema_drift"):
            line += f"; new payload fields: {meta['schema_drift']}"
        if meta.get("storm_held"):
            line += "; CHANGE STORM: its changes are held until `changewatch release`"
        return line
    # A fleet's run over several targets (pipeline/triggers/fleet_assets.py).
    if "targets_synced" in meta:
        return (
            f"{asset}: {meta['targets_synced']} target(s) synced, {meta['targets_failed']} "
            f"failed -> {meta['inserted']} inserted, {meta['updated']} updated, "
            f"{meta['deleted']} deleted, {meta['unchanged']} unchanged"
        )
    if "targets" in meta and "added" in meta:  # a query fleet's targets, read in the run
        return f"{asset}: {meta['targets']} target(s), added: {meta['added'] or 'none'}, " + (
            f"retired: {meta['retired'] or 'none'}"
        )
    if "evaluation_failed" in meta:  # see pipeline/assets/watch_assets.py, _failed
        return (
            f"{asset}: FAILED, its changes wait for the next run (other watches went on): "
            f"{meta['evaluation_failed']}"
        )
    if "changes_read" in meta:
        line = (
            f"{asset}: {meta['changes_read']} change(s) read, {meta['passed_filter']} passed "
            f"the filter, {meta['judged']} judged ({meta['judge_cache_hits']} cached), "
            f"{meta['notified']} notified, {meta['suppressed_duplicates']} duplicate(s), "
            f"{meta['held']} held"
        )
        if meta.get("judge_unavailable"):
            dropped = f", {meta['dropped']} dropped" if meta.get("dropped") else ""
            line += f"; judge {meta['judge_unavailable']}: {meta['held']} held{dropped}"
        if meta.get("daily_budget") is not None:
            line += (
                f"; daily budget of {meta['daily_budget']} calls reached: "
                f"{meta['held_for_budget']} held until tomorrow"
            )
        if meta.get("filter_errors"):
            line += (
                f"; the filter FAILED on {meta['filter_errors']} change(s), held (see the run's "
                "warnings and evaluations.filter_error)"
            )
        return line
    if "sent" in meta:
        suppressed = meta.get("debounce_suppressed")
        return (
            f"{asset}: {meta['sent']} delivered, {meta['retrying']} to retry, "
            f"{meta['dead_lettered']} dead-lettered"
            + (
                f" ({meta['interrupted_sends_parked']} cut short by a crash)"
                if meta.get("interrupted_sends_parked")
                else ""
            )
            + (
                f", {meta['interrupted_sends_requeued']} requeued after a crash"
                if meta.get("interrupted_sends_requeued")
                else ""
            )
            + (f", {suppressed} suppressed by debounce" if suppressed else "")
            + _held_by_circuits(meta.get("held_by_channel_circuit"))
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
