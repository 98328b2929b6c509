"""What one sync run costs inside its process: K changed sources in a code location of N.

bench_fleet.py measures a deployment over half an hour; this measures the part that dominates
it (a run's steps) in a minute, to compare ways of running them side by side. For each
``--storage`` (``pooled``: deploy/dagster.yaml's PooledPostgresStorage; ``dagster``: Dagster's
own PostgreSQL storage, a connection per query), in one process:

* fresh PostgreSQL databases for Dagster's storage and the warehouse, and a watches file of
  ``--sources`` N plain sources with a watch each (bench_fleet.py's), the first ``--changed``
  K of them served by a loopback demo API;
* the first sync of those K (not counted), then ``--rounds`` runs of the ``sync_sources`` job
  selecting them, after one issue of each changed: the CPU (user+system) of this process over
  each run (``execute_in_process``: steps, Dagster's events and our syncs, evaluations and
  delivery; not the process start or the code location's load, which bench_definitions.py
  measures), and the PostgreSQL sessions the run opened.

Run from the repository root::

    .venv/bin/python bench/bench_run_cost.py                     # N 1000, K 24, both storages
    .venv/bin/python bench/bench_run_cost.py --sources 24 --changed 24
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import uuid
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_fleet.py beside this file

from bench_fleet import watches_file  # noqa: E402
from changewatch.sources.demo import DemoAPIServer, DemoTracker  # noqa: E402

STORAGES = {
    "pooled": """storage:
  custom:
    module: changewatch.pipeline.definitions.postgres_storage
    class: PooledPostgresStorage
    config:
      postgres_url: {env: DAGSTER_PG_URL}
telemetry:
  enabled: false
""",
    "dagster": """storage:
  postgres:
    postgres_url: {env: DAGSTER_PG_URL}
telemetry:
  enabled: false
""",
}
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sessions(admin, database: str) -> int:
    with admin.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,))
        return cur.fetchone()[0]


def measure(args: argparse.Namespace, storage: str) -> dict:
    import dagster as dg
    from changewatch.pipeline.definitions.build_definitions import (
        SYNC_JOB,
        build_definitions,
        run_selections,
    )
    from changewatch.pipeline.project.watches_file import load_config

    name = f"bench_run_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(args.pg_url)
    admin = psycopg2.connect(args.pg_url)
    admin.autocommit = True
    trackers = [
        DemoTracker(issues=args.issues, seed=i, repo=f"acme/r{i:04d}") for i in range(args.changed)
    ]
    folder = Path(tempfile.mkdtemp(prefix="bench_run_cost_"))
    try:
        for db in (name, f"{name}_wh"):
            admin.cursor().execute(f'CREATE DATABASE "{db}"')
        home = folder / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(STORAGES[storage], encoding="utf-8")
        dagster_url = urlunsplit(parts._replace(scheme="postgresql+psycopg2", path=f"/{name}"))
        os.environ["DAGSTER_PG_URL"] = dagster_url
        os.environ["DAGSTER_HOME"] = str(home)
        os.environ["CHANGEWATCH_WAREHOUSE_URL"] = urlunsplit(
            parts._replace(path=f"/{name}_wh", query="schema=warehouse")
        )
        with DemoAPIServer(trackers[0], more=trackers[1:]) as api:
            os.environ["CHANGEWATCH_CONFIG"] = str(
                watches_file(folder, api.url, args.sources, 300, 0)
            )
            config = load_config()
            job = build_definitions(config).resolve_job_def(SYNC_JOB)
            selections = run_selections(config)
            selected = [k for s in config.sources[: args.changed] for k in selections[s.name]]
            with dg.DagsterInstance.get() as instance:

                def run() -> tuple[float, int]:
                    before, opened = cpu(), sessions(admin, name)
                    done = job.execute_in_process(
                        instance=instance, asset_selection=selected, run_config=QUIET
                    )
                    spent = cpu() - before
                    assert done.success, f"a run failed ({storage})"
                    return spent, sessions(admin, name) - opened

                run()  # the first syncs
                figures = []
                for _ in range(args.rounds):
                    for tracker in trackers:
                        tracker.mutate(update=1)
                    figures.append(run())
    finally:
        for db in (name, f"{name}_wh"):
            admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()
    spent = [f[0] for f in figures]
    return {
        "storage": storage,
        "core_s": statistics.median(spent),
        "per_source_ms": statistics.median(spent) / args.changed * 1000,
        "sessions": statistics.median(f[1] for f in figures),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=1000, help="sources in the code location")
    parser.add_argument("--changed", type=int, default=24, help="sources each run syncs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--issues", type=int, default=40)
    parser.add_argument(
        "--storage", nargs="+", choices=sorted(STORAGES), default=["pooled", "dagster"]
    )
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    if not 0 < args.changed <= args.sources:
        parser.error("--changed must be between 1 and --sources")
    with closing(psycopg2.connect(args.pg_url)):
        pass  # fails here, in one line, when PostgreSQL is not there
    print(
        f"bench_run_cost: a run of {args.changed} changed sources in a code location of "
        f"{args.sources}, median of {args.rounds} runs, in this process"
    )
    print(f"{'storage':>10}  {'core-s per run':>14}  {'ms per source':>13}  {'sessions':>8}")
    for storage in args.storage:
        f = measure(args, storage)
        print(
            f"{f['storage']:>10}  {f['core_s']:>14.2f}  {f['per_source_ms']:>13.0f}  "
            f"{f['sessions']:>8.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
