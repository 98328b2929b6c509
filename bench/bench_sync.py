"""Throughput of a full snapshot sync of the demo API, against a fetch+decode-only baseline.

Starts the demo API (a ``DemoTracker`` of ``--rows`` issues) on loopback, in its own process
like any real API (``--server thread`` runs it on a thread of this process instead), then:

* Phase A, fetch+decode only: one keep-alive ``httpx.Client`` walks every page through the
  ``Link`` header and ``orjson.loads`` each body. This is the floor for any sync.
* Phase B, full sync: ``run_sync`` of the ``demo_issues`` source from ``watches.yaml`` (snapshot,
  same endpoint and ``per_page``) into a fresh warehouse: every row is an insert. The time is
  split into the walk (``RestSource.fetch``, while a worker thread normalizes the pages it
  hands over), what normalization has left when the walk ends
  (``StreamingNormalizer.finish``) and the rest (diff, writes, commit, bookkeeping), by timing
  the real calls inside ``run_sync``.
* A and B run alternately ``--rounds`` times (default 3, each B on a fresh warehouse); the best
  of each is reported, so noise affects both alike.
* Phase C, on the last warehouse: a second sync with no upstream change (asserts 0 changes),
  then a mutation of 1000 updates and 100 deletes (``POST /_demo/mutate``) and a third sync
  (asserts exactly those).

CPU is counted for each phase too, in core-seconds of each party: this process (the sync or
the fetch loop, all its threads), the demo API's process, and a PostgreSQL server on this
machine (its backends, live and exited, from /proc). Their sum over the machine's cores is the
shortest time any schedule could do the phase in: the last lines compare that bound with the
first sync's target, so a run tells whether the target was missed for lack of CPU or for
time the cores sat idle, whatever else the machine was doing meanwhile.

Peak RSS is printed for each phase: the kernel's high-water mark (``VmHWM``) is reset when a
phase starts, so each figure is that phase's own peak, a first sync's as well as a
re-sync's (where /proc cannot reset it, the process's peak so far). With ``--server thread``
the tracker's memory counts too. The last lines compare rows/s of each kind of sync with
fetch-only and print ``TARGET MET`` when it reaches its target (a first sync half the
fetch-only rate, a re-sync 0.7 of it), else ``TARGET MISSED``, then the peak RSS of each
kind of sync against ``MEMORY_TARGET_MIB``.

Run from the repository root::

    /work/venv/bin/python bench/bench_sync.py                      # DuckDB, 100,000 rows
    /work/venv/bin/python bench/bench_sync.py --rows 20000 --per-page 50
    /work/venv/bin/python bench/bench_sync.py --backend postgres \\
        --pg-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the package is installed editable; this is only a fallback
    sys.path.insert(0, str(REPO))

from changewatch.pipeline.project.watches_file import load_config  # noqa: E402
from changewatch.sources.base import FetchResult  # noqa: E402
from changewatch.sources.demo import DemoAPIServer, DemoTracker  # noqa: E402
from changewatch.sources.rest import RestSource, RestSourceConfig  # noqa: E402
from changewatch.sources.stream import StreamingNormalizer  # noqa: E402
from changewatch.warehouse.backends import Warehouse, connect  # noqa: E402
from changewatch.warehouse.sync import SyncStats, run_sync  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
SOURCE_NAME = "demo_issues"
# Rows/s against fetch-only's (issue 9): a first sync at least half as fast, and a re-sync,
# what runs every interval afterwards, at least 0.7 as fast.
TARGET_RATIO = 0.5
RESYNC_TARGET_RATIO = 0.7
# Peak RSS a sync may reach, at any number of rows (issue 9: 600 MiB at a million).
MEMORY_TARGET_MIB = 600


# -- measuring -------------------------------------------------------------------------------


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float | None:
    """Current resident set size in MiB, where /proc is available."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def reset_peak() -> None:
    """Start a new high-water mark for this process (Linux: ``VmHWM``), where possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def phase_peak_mb() -> float:
    """Peak RSS since the last ``reset_peak`` in MiB (the process's peak without /proc)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return peak_rss_mb()
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return peak_rss_mb()


def memory_note() -> str:
    now = current_rss_mb()
    return f"peak RSS {phase_peak_mb():.0f} MiB" + (f" (now {now:.0f})" if now else "")


def _cpu_of(pid: int) -> tuple[float, float, int] | None:
    """Seconds of CPU a process has used itself, those of its reaped children, and its
    parent's pid; None when it is gone or not readable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # After the command: state, ppid, ..., utime (12th), stime, cutime, cstime.
    own = (int(fields[11]) + int(fields[12])) / tick
    reaped = (int(fields[13]) + int(fields[14])) / tick
    return own, reaped, int(fields[1])


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


class CpuMeter:
    """Core-seconds used so far by this process, the demo API's process and a PostgreSQL
    server on this machine (the server's postmaster with every child it has, live or reaped)."""

    def __init__(self, api_pid: int | None = None, postmaster: int | None = None) -> None:
        self.api_pid, self.postmaster = api_pid, postmaster

    def read(self) -> dict[str, float]:
        times = os.times()
        used = {"client": times.user + times.system}
        if self.api_pid is not None and (api := _cpu_of(self.api_pid)) is not None:
            used["API"] = api[0]
        if self.postmaster is not None and (main := _cpu_of(self.postmaster)) is not None:
            # A backend's CPU moves to the postmaster's reaped children when it exits.
            total = main[0] + main[1]
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and (child := _cpu_of(int(entry.name))) is not None:
                    if child[2] == self.postmaster:
                        total += child[0]
            used["PostgreSQL"] = total
        return used

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        """Core-seconds each party used during the ``with`` block (filled in when it ends)."""
        spent: dict[str, float] = {}
        before = self.read()
        try:
            yield spent
        finally:
            after = self.read()
            spent.update({who: after[who] - before[who] for who in after if who in before})


def describe_cpu(spent: dict[str, float]) -> str:
    """``client 1.90 + API 0.21 = 2.11 core-s``."""
    parts = " + ".join(f"{who} {seconds:.2f}" for who, seconds in spent.items())
    return f"{parts} = {sum(spent.values()):.2f} core-s"


@dataclass
class Timings:
    """Seconds spent in the parts of one ``run_sync`` call."""

    fetch: float = 0.0
    normalize: float = 0.0
    total: float = 0.0

    @property
    def rest(self) -> float:
        """Setup transaction, diff, writes, commit and bookkeeping."""
        return self.total - self.fetch - self.normalize


@dataclass
class SyncResult:
    label: str
    stats: SyncStats
    timings: Timings
    peak_rss_mb: float
    cpu: dict[str, float]

    @property
    def rows_per_s(self) -> float:
        return self.stats.rows_fetched / self.timings.total


@dataclass
class FetchOnlyResult:
    rows: int
    pages: int
    seconds: float
    peak_rss_mb: float
    cpu: dict[str, float]

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


@dataclass
class TimedSource:
    """A ``Source`` that times ``RestSource.fetch`` and otherwise is that source."""

    inner: RestSource
    timings: Timings = field(default_factory=Timings)

    @property
    def config(self) -> RestSourceConfig:
        return self.inner.config

    def fetch(self, *, cursor: str | None, validators: Any = None, sink: Any = None) -> FetchResult:
        start = time.perf_counter()
        try:
            return self.inner.fetch(cursor=cursor, validators=validators, sink=sink)
        finally:
            self.timings.fetch += time.perf_counter() - start


@contextmanager
def timed_normalize(timings: Timings) -> Iterator[None]:
    """Time what normalization has left when the walk ends (``StreamingNormalizer.finish``)."""
    original: Callable[..., Any] = StreamingNormalizer.finish

    def finish(self: StreamingNormalizer, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            timings.normalize += time.perf_counter() - start

    StreamingNormalizer.finish = finish  # type: ignore[method-assign]
    try:
        yield
    finally:
        StreamingNormalizer.finish = original  # type: ignore[method-assign]


# -- phases ----------------------------------------------------------------------------------


def fetch_only(config: RestSourceConfig, meter: CpuMeter) -> FetchOnlyResult:
    """Phase A: walk every page via the Link header with one keep-alive client; decode each."""
    gc.collect()
    reset_peak()
    rows = pages = 0
    with meter.measure() as cpu:  # its reads of /proc stay out of the time
        start = time.perf_counter()
        with httpx.Client(headers={"Accept": "application/json"}) as client:
            url: str | None = config.url
            params: dict[str, Any] | None = dict(config.params)
            while url is not None:
                response = client.get(url, params=params)
                response.raise_for_status()
                rows += len(orjson.loads(response.content))
                pages += 1
                url, params = response.links.get("next", {}).get("url"), None
        seconds = time.perf_counter() - start
    return FetchOnlyResult(rows, pages, seconds, phase_peak_mb(), cpu)


def full_sync(wh: Warehouse, config: RestSourceConfig, label: str, meter: CpuMeter) -> SyncResult:
    """One ``run_sync`` of the source, with fetch and normalize timed inside it."""
    gc.collect()
    reset_peak()
    source = TimedSource(RestSource(config))
    timings = source.timings
    with timed_normalize(timings), meter.measure() as cpu:
        start = time.perf_counter()
        stats = run_sync(wh, source)
        timings.total = time.perf_counter() - start
    return SyncResult(label, stats, timings, phase_peak_mb(), cpu)


# -- the demo API ----------------------------------------------------------------------------


@dataclass
class DemoServer:
    url: str
    mutate: Callable[..., dict[str, Any]]
    pid: int | None = None  # its own process, if it has one


@contextmanager
def thread_server(rows: int, seed: int) -> Iterator[DemoServer]:
    """The demo API on a thread of this process (it shares the GIL with the sync)."""
    with DemoAPIServer(DemoTracker(issues=rows, seed=seed)) as server:
        yield DemoServer(server.url, server.tracker.mutate)


@contextmanager
def process_server(rows: int, seed: int) -> Iterator[DemoServer]:
    """The demo API in its own process on a free loopback port; mutated over HTTP."""
    command = [sys.executable, "-u", "-m", "changewatch.sources.demo.server", "--port", "0"]
    command += ["--issues", str(rows), "--seed", str(seed)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # "demo API serving ... at http://127.0.0.1:PORT"
        if " at http" not in first:
            raise SystemExit(f"the demo API did not start: {first!r}")
        url = first.rsplit(" at ", 1)[1].strip()

        def mutate(**changes: int) -> dict[str, Any]:
            response = httpx.post(f"{url}/_demo/mutate", json=changes, timeout=60)
            response.raise_for_status()
            return response.json()

        yield DemoServer(url, mutate, process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- warehouses ------------------------------------------------------------------------------


class Warehouses:
    """Fresh warehouses for one backend; everything created here is removed by ``close()``."""

    def __init__(self, backend: str, pg_url: str) -> None:
        self.backend, self.pg_url = backend, pg_url
        self._tmp = tempfile.TemporaryDirectory(prefix="bench_sync_")
        self._open: list[Warehouse] = []
        self._schemas: list[str] = []

    def fresh(self) -> tuple[Warehouse, str]:
        if self.backend == "duckdb":
            path = Path(self._tmp.name) / f"w{len(self._open)}.duckdb"
            where = str(path)
            wh = connect(f"duckdb:///{path}")
        else:
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            self._schemas.append(schema)
            sep = "&" if "?" in self.pg_url else "?"
            where = f"schema {schema}"
            wh = connect(f"{self.pg_url}{sep}schema={schema}")
        self._open.append(wh)
        return wh, where

    def close(self) -> None:
        for wh in self._open:
            try:
                wh.close()
            except Exception as error:  # noqa: BLE001 - keep cleaning up
                print(f"warning: closing a warehouse failed: {error}", file=sys.stderr)
        self._open.clear()
        if self._schemas:
            with connect(self.pg_url) as admin, admin.transaction():
                for schema in self._schemas:
                    admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            self._schemas.clear()
        self._tmp.cleanup()

    def postmaster(self) -> int | None:
        """The pid of the PostgreSQL server's postmaster, if it runs on this machine."""
        if self.backend != "postgres":
            return None
        with connect(self.pg_url) as probe:
            # Read while the backend lives: its parent is the postmaster.
            backend = _cpu_of(probe.fetch("SELECT pg_backend_pid()")[0][0])
            if backend is None or not _is_postgres(backend[2]):
                return None  # another machine's server (the pid is not one of ours)
            return backend[2]


# -- reporting -------------------------------------------------------------------------------


def describe_sync(result: SyncResult) -> str:
    s, t = result.stats, result.timings
    return (
        f"{result.label}: {s.rows_fetched:,} rows in {t.total:.2f}s = {result.rows_per_s:,.0f} "
        f"rows/s [fetch (normalizing alongside) {t.fetch:.2f}s, normalize tail {t.normalize:.2f}s, "
        f"diff+write+commit "
        f"{t.rest:.2f}s] ins={s.inserted} upd={s.updated} del={s.deleted} "
        f"unchanged={s.unchanged}; {memory_note()}; CPU {describe_cpu(result.cpu)}"
    )


def print_cpu_bound(
    best_fetch: FetchOnlyResult, syncs: list[SyncResult], *, server_in_process: bool
) -> None:
    """How much CPU a first sync needed, and whether the machine's cores could have done it
    within the target time at all."""
    cores = len(os.sched_getaffinity(0))
    least = min(syncs, key=lambda r: sum(r.cpu.values()))
    needed = sum(least.cpu.values())
    allowed = best_fetch.seconds / TARGET_RATIO
    print(f"CPU fetch-only, best round: {describe_cpu(best_fetch.cpu)}")
    print(f"CPU first sync, least of {len(syncs)} rounds: {describe_cpu(least.cpu)}")
    if server_in_process:
        print("  (the API runs in this process: its CPU is the client's)")
    # With every core busy from start to end, a first sync takes needed / cores seconds: no
    # schedule does better, so this is the best ratio this work can reach on this machine.
    floor = needed / cores
    verdict = "within reach" if floor <= allowed else "OUT OF REACH"
    print(
        f"CPU bound first sync: {needed:.2f} core-s on {cores} cores take at least {floor:.2f}s, "
        f"ratio at most {best_fetch.seconds / floor:.2f}; the target allows {allowed:.2f}s "
        f"({cores * allowed:.2f} core-s): {verdict}"
    )


def source_config(url: str, per_page: int) -> RestSourceConfig:
    """The ``demo_issues`` source of ``watches.yaml``, pointed at ``url``, with ``per_page``."""
    os.environ["CHANGEWATCH_DEMO_URL"] = url
    config = load_config(REPO / "watches.yaml").source(SOURCE_NAME)
    if config.sync != "snapshot":
        raise SystemExit(f"{SOURCE_NAME} in watches.yaml is not a snapshot source")
    params = {**config.params, "per_page": per_page}
    return config.model_copy(update={"params": params})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="issues (default: %(default)s)")
    parser.add_argument("--per-page", type=int, default=100, help="page size, at most 100")
    parser.add_argument("--backend", choices=("duckdb", "postgres"), default="duckdb")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="default: %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="A/B alternations (default: 3)")
    parser.add_argument("--seed", type=int, default=1, help="tracker seed (default: 1)")
    parser.add_argument(
        "--server",
        choices=("process", "thread"),
        default="process",
        help="run the demo API in its own process, as a real API is (default), or on a "
        "thread of this one, sharing its GIL",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.per_page <= 100:
        parser.error("--per-page must be between 1 and 100 (the API caps it at 100)")
    if args.rows < 1100:
        parser.error("--rows must be at least 1100 (phase C updates 1000 and deletes 100)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    start = time.perf_counter()
    server_cm = (
        process_server(args.rows, args.seed)
        if args.server == "process"
        else thread_server(args.rows, args.seed)
    )
    fetches: list[FetchOnlyResult] = []
    syncs: list[SyncResult] = []
    warehouses = Warehouses(args.backend, args.pg_url)
    try:
        with server_cm as server:
            print(
                f"demo API ({args.server}): {args.rows:,} issues ready in "
                f"{time.perf_counter() - start:.2f}s; {memory_note()}"
            )
            baseline_rss = peak_rss_mb()
            config = source_config(server.url, args.per_page)
            print(f"server {server.url}; backend {args.backend}; per_page {args.per_page}")
            meter = CpuMeter(server.pid, warehouses.postmaster())
            wh = None
            for round_no in range(1, args.rounds + 1):
                fetched = fetch_only(config, meter)
                fetches.append(fetched)
                print(
                    f"A{round_no} fetch+decode only: {fetched.rows:,} rows, {fetched.pages} "
                    f"pages in {fetched.seconds:.2f}s = {fetched.rows_per_s:,.0f} rows/s; "
                    f"{memory_note()}; CPU {describe_cpu(fetched.cpu)}"
                )
                assert fetched.rows == args.rows, f"fetched {fetched.rows} rows"
                wh, where = warehouses.fresh()
                result = full_sync(wh, config, f"B{round_no} full sync (first, {where})", meter)
                syncs.append(result)
                print(describe_sync(result))
                assert result.stats.inserted == args.rows, result.stats
                assert result.stats.changed == args.rows, result.stats

            assert wh is not None
            second = full_sync(wh, config, "C1 second sync (no change)", meter)
            print(describe_sync(second))
            assert second.stats.changed == 0, f"expected no changes: {second.stats}"
            assert second.stats.unchanged == args.rows, second.stats

            mutated = server.mutate(update=1000, delete=100)
            assert len(mutated["updated"]) == 1000 and len(mutated["deleted"]) == 100
            third = full_sync(wh, config, "C2 third sync (1000 updated, 100 deleted)", meter)
            print(describe_sync(third))
            s = third.stats
            assert (s.inserted, s.updated, s.deleted) == (0, 1000, 100), s
            assert s.row_count == args.rows - 100, s
    finally:
        warehouses.close()

    best_fetch = max(fetches, key=lambda r: r.rows_per_s)
    best_sync = max(syncs, key=lambda r: r.rows_per_s)
    t = best_sync.timings
    print()
    print(
        f"{args.backend}, {args.rows:,} rows, per_page {args.per_page}, best of {args.rounds} "
        f"(peak RSS: the phase's own, in its first round; imports and setup "
        f"{baseline_rss:.0f} MiB)"
    )
    print(f"{'phase':<34}{'rows/s':>12}{'seconds':>10}{'peak RSS MiB':>14}")
    rows = [
        ("A fetch+decode only", best_fetch.rows_per_s, best_fetch.seconds, fetches[0].peak_rss_mb),
        ("B full sync, first (all inserts)", best_sync.rows_per_s, t.total, syncs[0].peak_rss_mb),
        ("C1 full sync, no change", second.rows_per_s, second.timings.total, second.peak_rss_mb),
        ("C2 full sync, 1k upd/100 del", third.rows_per_s, third.timings.total, third.peak_rss_mb),
    ]
    for name, rate, seconds, rss in rows:
        print(f"{name:<34}{rate:>12,.0f}{seconds:>10.2f}{rss:>14.0f}")
    print(
        f"B breakdown: fetch {t.fetch:.2f}s ({t.fetch / t.total:.0%}), normalize "
        f"{t.normalize:.2f}s ({t.normalize / t.total:.0%}), diff+write+commit {t.rest:.2f}s "
        f"({t.rest / t.total:.0%})"
    )
    # The target is judged per kind of sync: a first sync is a bulk load (every row written
    # to the table and the change log), a re-sync is what runs every interval afterwards.
    for name, rate, target in (
        ("first sync (bulk load)", best_sync.rows_per_s, TARGET_RATIO),
        ("re-sync, no change", second.rows_per_s, RESYNC_TARGET_RATIO),
        ("re-sync, 1k upd/100 del", third.rows_per_s, RESYNC_TARGET_RATIO),
    ):
        ratio = rate / best_fetch.rows_per_s
        verdict = "TARGET MET" if ratio >= target else "TARGET MISSED"
        print(f"ratio {name} / fetch-only: {ratio:.2f} (target >= {target}): {verdict}")
    print_cpu_bound(best_fetch, syncs, server_in_process=args.server == "thread")
    for name, rss in (
        ("first sync", max(s.peak_rss_mb for s in syncs)),
        ("re-sync", max(second.peak_rss_mb, third.peak_rss_mb)),
    ):
        verdict = "TARGET MET" if rss < MEMORY_TARGET_MIB else "TARGET MISSED"
        print(
            f"peak RSS {name}, {args.rows:,} rows: {rss:.0f} MiB "
            f"(target < {MEMORY_TARGET_MIB}): {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
