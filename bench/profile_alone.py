"""Where "the same work alone" of bench_batch_cost.py goes: syncs, evaluations, delivery.

bench_batch_cost.py prints what a changed source costs with no Dagster at all (``run_sync``,
``evaluate_watch``, ``deliver_due``); this splits that figure by phase and by side (this
process, the private PostgreSQL server), and can write a cProfile of this process (CPU time)
and count the statements the server ran per changed source, by their first words:

* ``--changed`` K plain sources of bench_fleet.py's watches file, served by a loopback demo
  API, each with its watch and the file channel, in a private PostgreSQL warehouse;
* synced twice first (the first sync is silent; not counted), then each round one issue of
  each source is updated and the K are synced, evaluated and delivered;
* printed: core-s per changed source of each phase (median of the rounds), this process's and
  the server's.

Run from the repository root::

    .venv/bin/python bench/profile_alone.py                           # K 24, 5 rounds
    .venv/bin/python bench/profile_alone.py --profile /tmp/alone.prof # + cProfile, CPU time
    .venv/bin/python bench/profile_alone.py --statements              # + the server's statements
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_fleet.py beside this file

from bench_batch_cost import evaluate_watches  # noqa: E402
from bench_fleet import watches_file  # noqa: E402
from changewatch.sources.demo import DemoAPIServer, DemoTracker  # noqa: E402
from private_postgres import private_postgres  # noqa: E402

PHASES = ("sync", "evaluate", "deliver")


def measure(args: argparse.Namespace) -> dict:
    from changewatch.channels.outbox import deliver_due
    from changewatch.pipeline.project.watches_file import load_config
    from changewatch.sources import build_source
    from changewatch.warehouse.backends import connect
    from changewatch.warehouse.sync import run_sync

    trackers = [
        DemoTracker(issues=args.issues, seed=i, repo=f"acme/r{i:04d}") for i in range(args.changed)
    ]
    folder = Path(tempfile.mkdtemp(prefix="profile_alone_"))
    spent: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
    statements: collections.Counter[str] = collections.Counter()
    with private_postgres() as server:
        parts = urlsplit(server.url)
        admin = psycopg2.connect(server.url)
        admin.autocommit = True
        admin.cursor().execute("CREATE DATABASE warehouse")
        url = urlunsplit(parts._replace(path="/warehouse", query="schema=warehouse"))
        with DemoAPIServer(trackers[0], more=trackers[1:]) as api:
            os.environ["CHANGEWATCH_CONFIG"] = str(
                watches_file(folder, api.url, args.changed, 300, 0)
            )
            config = load_config()
            watches = list(config.watches)

            def clock() -> tuple[float, float]:
                return time.process_time(), server.cpu_seconds()

            def one_round(counted: bool) -> None:
                with connect(url) as wh:
                    marks = [clock()]
                    for source in config.sources:
                        run_sync(wh, build_source(source))
                    marks.append(clock())
                    evaluate_watches(wh, config, watches)
                    marks.append(clock())
                    deliver_due(wh, config.channels)
                    marks.append(clock())
                if counted:
                    for phase, a, b in zip(PHASES, marks, marks[1:], strict=False):
                        spent[phase].append((b[0] - a[0], b[1] - a[1]))

            one_round(False)  # the first syncs (silent)
            for tracker in trackers:
                tracker.mutate(update=1)
            one_round(False)  # warm: the first changes evaluated and delivered
            log = None
            if args.statements:
                admin.cursor().execute("ALTER SYSTEM SET log_statement = 'all'")
                admin.cursor().execute("SELECT pg_reload_conf()")
                time.sleep(0.5)
                log = Path(server_log(admin))
                offset = log.stat().st_size
            profile = cProfile.Profile(time.process_time) if args.profile else None
            for _ in range(args.rounds):
                for tracker in trackers:
                    tracker.mutate(update=1)
                with profile or nullcontext():
                    one_round(True)
            if profile is not None:
                profile.dump_stats(args.profile)
            if log is not None:
                text = log.read_bytes()[offset:].decode("utf-8", "replace")
                if args.statements != "-":
                    Path(args.statements).write_text(text, encoding="utf-8")
                for match in re.finditer(r"LOG:  (?:statement|execute [^:]*): (.*)", text):
                    statements[" ".join(match.group(1).split()[:3])[:60]] += 1
        admin.close()
    return {"spent": spent, "statements": statements}


def server_log(admin) -> str:
    with admin.cursor() as cur:
        cur.execute("SHOW data_directory")
        return str(Path(cur.fetchone()[0]).parent / "server.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changed", type=int, default=24, help="sources, each changed a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--issues", type=int, default=40)
    parser.add_argument("--profile", help="write cProfile stats (CPU time) of the rounds here")
    parser.add_argument(
        "--statements",
        nargs="?",
        const="-",
        help="count the server's statements (log_statement); with a path, write its log there",
    )
    args = parser.parse_args(argv)
    f = measure(args)
    k = args.changed
    print(
        f"profile_alone: {k} changed sources, {args.issues} issues each, 1 updated a round, "
        f"{args.rounds} rounds (medians; core-s per changed source; load {os.getloadavg()[0]:.2f})"
    )
    total_own = total_server = 0.0
    for phase in PHASES:
        own = statistics.median(r[0] for r in f["spent"][phase]) / k
        served = statistics.median(r[1] for r in f["spent"][phase]) / k
        total_own, total_server = total_own + own, total_server + served
        print(f"{phase + ':':<10} {own + served:.4f} (this process {own:.4f}, server {served:.4f})")
    print(
        f"{'total:':<10} {total_own + total_server:.4f} "
        f"(this process {total_own:.4f}, server {total_server:.4f})"
    )
    if f["statements"]:
        count = sum(f["statements"].values())
        print(f"statements per changed source: {count / k / args.rounds:.1f}")
        for text, n in f["statements"].most_common(40):
            print(f"  {n / k / args.rounds:6.2f}  {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
