"""Throughput of evaluation and delivery: changes -> outbox -> a file channel, per backend.

Starts the demo API (a ``DemoTracker`` of ``--changes`` issues) on a loopback thread, syncs it
once into a fresh warehouse (untimed: every issue is an insert change, and the source's
baseline is ``evaluate``), then times, on each backend:

* evaluate: ``evaluate_watch`` of a SQL-only watch that every insert passes (title, body and
  url templates rendered for each change, one outbox row and one delivery per change);
* deliver: ``deliver_due`` of every pending delivery to a ``file`` channel (one JSON line
  each), then checks the file holds exactly one line per change.

Each round uses a fresh warehouse and file; the best round is reported. It prints evaluate s,
deliver s, notifications/s end to end (changes / (evaluate s + deliver s)), the CPU seconds
this process spent on both (the database server's are not counted; on a busy machine the gap
to wall time is the wait) and the peak RSS (``ru_maxrss``, the process's high-water mark) per
backend, and ``TARGET MET`` when every backend reaches 2,000
notifications/s, else ``TARGET MISSED``.

Run from the repository root::

    .venv/bin/python bench/bench_notify.py                     # both backends, 10,000 changes
    .venv/bin/python bench/bench_notify.py --backend duckdb --changes 2000 --rounds 1
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the package is installed editable; this is only a fallback
    sys.path.insert(0, str(REPO))

from changewatch.channels.config import FileChannelConfig  # noqa: E402
from changewatch.channels.outbox import deliver_due  # noqa: E402
from changewatch.evaluators.config import Watch  # noqa: E402
from changewatch.evaluators.evaluate import evaluate_watch  # noqa: E402
from changewatch.evaluators.filters import compile_filter  # noqa: E402
from changewatch.pipeline.project.watches_file import load_config  # noqa: E402
from changewatch.sources.demo import DemoAPIServer, DemoTracker  # noqa: E402
from changewatch.sources.rest import RestSource, RestSourceConfig  # noqa: E402
from changewatch.warehouse.backends import connect  # noqa: E402
from changewatch.warehouse.sync import run_sync  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
SOURCE_NAME = "demo_issues"
TARGET_RATE = 2000.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


@dataclass
class Round:
    backend: str
    changes: int
    evaluate_s: float
    deliver_s: float
    cpu_s: float
    peak_rss_mb: float

    @property
    def rate(self) -> float:
        return self.changes / (self.evaluate_s + self.deliver_s)


def watch(channel: str) -> Watch:
    """A SQL-only watch every new issue passes, with templates like the demo's."""
    return Watch(
        name="every_new_issue",
        sources=[SOURCE_NAME],
        where="kind = 'insert'",
        channels=[channel],
        dedupe="per_object",
        title="New issue #{{ key }}: {{ new.title }}",
        body="{{ new.title }}, opened by {{ new.author }} ({{ new.comments }} comments).",
    )


def source_config(url: str) -> RestSourceConfig:
    """The ``demo_issues`` source of ``watches.yaml``, pointed at ``url``."""
    config = load_config(REPO / "watches.yaml").source(SOURCE_NAME)
    return config.model_copy(update={"base_url": url})


def one_round(backend: str, pg_url: str, api_url: str, changes: int, tmp: Path) -> Round:
    """Sync into a fresh warehouse, then time evaluation and delivery to a fresh file."""
    config = source_config(api_url)
    schema = None
    if backend == "duckdb":
        url = f"duckdb:///{tmp / f'w_{uuid.uuid4().hex[:8]}.duckdb'}"
    else:
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        url = f"{pg_url}{'&' if '?' in pg_url else '?'}schema={schema}"
    out = tmp / f"notifications_{uuid.uuid4().hex[:8]}.jsonl"
    channel = FileChannelConfig(name="file", type="file", path=str(out))
    w = watch(channel.name)
    compiled = compile_filter(
        w.where, watch=w.name, columns={c: s.type for c, s in config.columns.items()}
    )
    try:
        with connect(url) as wh:
            synced = run_sync(wh, RestSource(config))
            assert synced.inserted == changes, synced
            gc.collect()
            start, cpu = time.perf_counter(), time.process_time()
            stats = evaluate_watch(wh, w, {SOURCE_NAME: config}, {SOURCE_NAME: compiled})
            evaluated = time.perf_counter()
            delivered = deliver_due(wh, [channel])
            finished, cpu = time.perf_counter(), time.process_time() - cpu
        assert stats.notified == changes, stats
        assert (delivered.sent, delivered.retrying, delivered.dead) == (changes, 0, 0), delivered
        with out.open("rb") as lines:
            assert sum(1 for _ in lines) == changes, f"{out} does not hold {changes} lines"
        return Round(backend, changes, evaluated - start, finished - evaluated, cpu, peak_rss_mb())
    finally:
        out.unlink(missing_ok=True)
        if schema:
            with connect(pg_url) as admin, admin.transaction():
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=10_000, help="default: %(default)s")
    parser.add_argument("--backend", choices=("duckdb", "postgres", "both"), default="both")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="default: %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="best of (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.changes < 1 or args.rounds < 1:
        parser.error("--changes and --rounds must be at least 1")
    backends = ["duckdb", "postgres"] if args.backend == "both" else [args.backend]
    best: dict[str, Round] = {}
    with (
        DemoAPIServer(DemoTracker(issues=args.changes, seed=1)) as server,
        tempfile.TemporaryDirectory(prefix="bench_notify_") as tmp,
    ):
        for backend in backends:
            for number in range(1, args.rounds + 1):
                result = one_round(backend, args.pg_url, server.url, args.changes, Path(tmp))
                print(
                    f"{backend} round {number}: evaluate {result.evaluate_s:.2f}s, deliver "
                    f"{result.deliver_s:.2f}s, {result.rate:,.0f} notifications/s "
                    f"(this process's CPU {result.cpu_s:.2f}s); "
                    f"peak RSS {result.peak_rss_mb:.0f} MiB"
                )
                if backend not in best or result.rate > best[backend].rate:
                    best[backend] = result
    print()
    print(f"{args.changes:,} changes -> notifications -> file channel, best of {args.rounds}")
    print(
        f"{'backend':<10}{'evaluate s':>12}{'deliver s':>11}{'notif/s':>10}{'CPU s':>7}"
        f"{'peak RSS MiB':>14}"
    )
    for backend, r in best.items():
        print(
            f"{backend:<10}{r.evaluate_s:>12.2f}{r.deliver_s:>11.2f}{r.rate:>10,.0f}"
            f"{r.cpu_s:>7.2f}{r.peak_rss_mb:>14.0f}"
        )
    met = all(r.rate >= TARGET_RATE for r in best.values())
    print(f"{'TARGET MET' if met else 'TARGET MISSED'}: >= {TARGET_RATE:,.0f} notifications/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
