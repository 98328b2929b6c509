"""What loading the code location costs, for N sources: every run and code server pays it.

A Dagster run is a process that imports ``changewatch.pipeline.definitions.code_location``, which
reads and checks the watches file and builds every source's and watch's assets, whichever few it
then runs. So that load is part of what each poll that starts a run costs (issue 18). The code
server (and ``dagster dev``) does more at its start: it resolves every job and sends the
daemon and the UI a snapshot of them all; ``--snapshot`` measures that too, as Dagster makes
it (``RepositorySnap.from_def``, a private API: this is a bench). For each N in
``--sources`` this writes bench_fleet's watches file (N ``rest`` sources with a watch each,
filters and all; ``--shape fleet``: one fleet of N targets and one watch), then imports
the module ``--rounds`` times, each in a fresh process, and prints the least CPU (user +
system, from the child's ``wait4``) and peak RSS of one load, beside those of a process
that imports Dagster, polars and DuckDB alone (the floor).
Nothing is contacted: the warehouse URL is only read. ``--against REV`` loads that git
revision's code too (``git archive``, put first on ``PYTHONPATH``), round by round in turn
with the working tree's, so both see the same machine.

Run from the repository root::

    .venv/bin/python bench/bench_definitions.py [--sources 1 100 1000] [--rounds 3] [--against REV]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fleet import SHAPES, watches_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLOOR = "import dagster, polars, duckdb"
LOAD = "import changewatch.pipeline.definitions.code_location"
# What the code server does at its start, after the load.
SNAPSHOT = (
    "import changewatch.pipeline.definitions.code_location as d\n"
    "from dagster._core.remote_representation.external_data import RepositorySnap\n"
    "RepositorySnap.from_def(d.defs.get_repository_def())"
)
PACKAGES = ("pipeline", "sources", "evaluators", "channels", "sql", "warehouse")


def checkout(revision: str, folder: Path) -> Path:
    """A folder to put on PYTHONPATH so ``changewatch`` is ``revision``'s code."""
    archive = subprocess.run(
        ["git", "archive", revision], cwd=REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder / "tree", filter="data")
    (folder / "path" / "changewatch").mkdir(parents=True)
    for package in PACKAGES:
        (folder / "path" / "changewatch" / package).symlink_to(folder / "tree" / package)
    return folder / "path"


def cost(code: str, env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds and peak RSS (MiB) of one fresh process running ``code``."""
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own figures
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{code!r} failed (exit {proc.returncode})")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="a git revision to load side by side")
    parser.add_argument(
        "--snapshot", action="store_true", help="also the code server's start (load + snapshot)"
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="plain",
        help="N plain sources with a watch each, or one fleet of N targets with one watch",
    )
    args = parser.parse_args(argv)
    env = os.environ | {"CHANGEWATCH_WAREHOUSE_URL": "postgresql://bench@127.0.0.1:1/none"}
    floor = min(cost(FLOOR, env)[0] for _ in range(args.rounds))
    header = (
        f"{'code':>12} {'sources':>8} {'CPU s per load':>15} {'per source ms':>14} {'RSS MiB':>8}"
    )
    if args.snapshot:
        header += f" {'code server start CPU s':>24} {'RSS MiB':>8}"
    print(header)
    print(f"{'(floor)':>12} {'':>8} {floor:>15.2f} {'':>14} {'':>8}   ({FLOOR})")
    with tempfile.TemporaryDirectory(prefix="bench_definitions_") as tmp:
        trees: dict[str, dict[str, str]] = {"this tree": {}}
        if args.against:
            path = checkout(args.against, Path(tmp) / "against")
            trees[args.against] = {"PYTHONPATH": str(path)}
        for count in sorted(args.sources):
            folder = Path(tmp) / str(count)
            folder.mkdir()
            config = {
                "CHANGEWATCH_CONFIG": str(
                    watches_file(
                        folder, "http://127.0.0.1:9", count, 300.0, 285.0, shape=args.shape
                    )
                )
            }
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            starts: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, extra in trees.items():
                    runs[name].append(cost(LOAD, env | config | extra))
                    if args.snapshot:
                        starts[name].append(cost(SNAPSHOT, env | config | extra))
            for name, found in runs.items():
                cpu = min(c for c, _ in found)
                rss = max(r for _, r in found)
                per_source = (cpu - floor) / count * 1000
                print(
                    f"{name:>12} {count:>8,} {cpu:>15.2f} {per_source:>14.1f} {rss:>8.0f}", end=""
                )
                if args.snapshot:
                    start, start_rss = (
                        min(c for c, _ in starts[name]),
                        max(r for _, r in starts[name]),
                    )
                    print(f" {start:>24.2f} {start_rss:>8.0f}")
                else:
                    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
