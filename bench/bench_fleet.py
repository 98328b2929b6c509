"""Fleet bench: N sources on one loopback API, polled by a real dagster-daemon and code server.

Issue 18's figures, measured from outside as a deployment runs (README "Deploy on several
processes"): for each N in ``--sources`` (default 100 and 1,000), and each ``--shape``, a
phase of its own:

* a fresh Dagster database and a fresh warehouse schema on PostgreSQL (``--pg-url``), and a
  watches file of N targets: ``plain``, N ``rest`` snapshot sources with a watch each;
  ``fleet``, one ``rest`` fleet source (``for_each`` over N repositories) with one watch.
  Each target lists ``--issues`` issues on one page, polled every ``--interval`` with
  ``--jitter`` (probes on), the sync sensors ticking every ``--tick`` seconds (the file's
  ``polling: tick``; one value, or one per ``--sources`` count, so ``--sources 1000 1000
  --tick 30 60`` sets two ticks side by side); every update goes to a file channel;
* one demo API on a thread of this process serving N trackers (``acme/r0000``...), so its
  CPU is not counted; the code server (``dagster code-server start``) and ``dagster-daemon
  run`` as deploy/ starts them, with deploy/dagster.yaml and deploy/workspace.yaml, the
  daemon with the allocator settings deploy/docker-compose.yml gives it (``--malloc glibc``
  drops them);
* warm-up: every target's first sync (its first probe always says "changed"); then changes
  begin: ``--change-rate`` of the targets each minute (default 5%), one issue updated at a
  time, at even spacing, on targets drawn at random; after one ``--interval`` of changes
  (steady state) the measured window of ``--minutes`` begins (one value, or one per
  ``--sources`` count), changes going on through it;
  afterwards the bench waits for the last changes' notifications.

Counted over the window: CPU (user+system) of the daemon, of the code server (its proxy and
server processes: the sensor's probes live there) and of the run workers it spawns, from
/proc (bench/proctree.py); probes done (the API's requests less those of syncs, from the
warehouse's ``sync_runs``) against probes due (each source's interval slots begun in the
window); runs started (Dagster's ``runs`` table) by trigger, syncs done, and syncs of a
target with no change since its previous sync (runs a probe should have spared). Latency of
each change: to the run that synced it being requested (the Dagster run's creation), and to
its notification line appearing in the file. RSS (sampled every ``--sample`` seconds):
peaks of the daemon, the code server and the largest run worker (``VmHWM``), and the
daemon's and code server's peak over each 5 minutes of the window in turn (its halves, if
shorter), to show whether memory grows with polls done or levels off; memory counts as flat
when the last span's peak is at most 5% above that of the span ending at the window's half.

Beside them, in the same invocation: today's one-run-per-source path, one source with
``probe: false`` (a run at every ``--baseline-interval``), its CPU per poll over
``--baseline-polls`` runs, idle daemon and code server included; ``--baseline-polls 0``
skips it. A table of every phase's figures ends the output, then ``TARGET MET`` or
``TARGET MISSED`` lines for the issue's targets.

Run from the repository root::

    .venv/bin/python bench/bench_fleet.py                                   # 100 and 1,000
    .venv/bin/python bench/bench_fleet.py --sources 100 --interval 60 --minutes 5
    .venv/bin/python bench/bench_fleet.py --sources 100 1000 --minutes 10 30  # the figure run
    .venv/bin/python bench/bench_fleet.py --shape plain fleet --sources 100
    .venv/bin/python bench/bench_fleet.py --sources 1000 1000 --tick 30 60 --baseline-polls 0

Run workers import the code from the checkout: a tree others are editing can fail a run
mid-bench; bench a clean copy (``git archive HEAD``, with ``PYTHONPATH`` pointing at it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/proctree.py beside this file

import proctree  # noqa: E402
from changewatch.pipeline.polling.poll_slots import jitter_offset  # noqa: E402
from changewatch.sources.demo import DemoAPIServer, DemoTracker  # noqa: E402
from proctree import die_with_parent, free_port, listening, stop_tree  # noqa: E402

BIN = Path(sys.executable).parent
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
# The sync sensors' default tick (pipeline/project/watches_file.py's DEFAULT_TICK): one tick's wait.
TICK_S = 30.0
# Issue 18's targets.
TARGET_CORE_S_PER_POLL = 0.15
TARGET_MACHINE_SHARE = 0.25
TARGET_PROBE_MS = 20.0
FLAT_SPAN_S = 300.0  # memory's peak is printed for each 5 minutes of the window
TARGET_FLAT = 0.05  # at most 5% more memory at the window's end than at its half
MIB = 1 << 20
LONG_LIVED = ("daemon", "code server")  # the processes whose memory must stay flat
# Why the sensor requested a run (pipeline/triggers/sync_sensors.py's TRIGGER_TAG; not imported, so
# this process does not load Dagster).
TRIGGER_TAG = "changewatch/trigger"


# -- one phase's setting up ---------------------------------------------------------------


def source_settings(index: int, base_url: str, interval: float, jitter: float) -> dict:
    name = f"s{index:04d}"
    return {
        "name": name,
        "type": "rest",
        "base_url": base_url,
        "path": f"/repos/acme/r{index:04d}/issues",
        "params": {"state": "all", "per_page": 100},  # one page: the probe sees every change
        "paginator": {"type": "link_header"},
        "table": name,
        "primary_key": "number",
        "updated_at": "updated_at",
        "interval": f"{interval:g}s",
        "jitter": f"{jitter:g}s",
        "columns": {
            "number": "bigint",
            "title": "text",
            "state": "text",
            "comments": "bigint",  # an update always moves it (DemoTracker._change)
            "updated_at": "timestamp",
        },
    }


FLEET = "fleet"
SHAPES = ("plain", "fleet")


def sync_name(shape: str, index: int) -> str:
    """What the ``index``-th target syncs as (``sync_runs.source``; its jitter's seed too)."""
    return f"s{index:04d}" if shape == "plain" else f"{FLEET}[r{index:04d}]"


def watches_file(
    folder: Path,
    base_url: str,
    count: int,
    interval: float,
    jitter: float,
    *,
    shape: str = "plain",
    probe: bool = True,
    tick: float = TICK_S,
) -> Path:
    """N plain sources with a watch each, or one fleet of N targets with one watch; every
    update goes to one file channel; the sensors tick every ``tick`` seconds."""
    sources = [source_settings(i, base_url, interval, jitter) for i in range(count)]
    if shape == FLEET:
        # One entry: the table gains a `repo` column, in front of its primary key.
        sources = [
            sources[0]
            | {
                "name": FLEET,
                "table": FLEET,
                "path": "/repos/acme/{target}/issues",
                "for_each": {"values": [f"r{i:04d}" for i in range(count)]},
                "target_column": "repo",
            }
        ]
    for source in sources:
        source["probe"] = probe
    config = {
        "version": 1,
        "polling": {"tick": f"{tick:g}s"},
        "sources": sources,
        "channels": [{"name": "file", "type": "file", "path": str(folder / "notifications.jsonl")}],
        "watches": [
            {
                "name": f"updates_{s['name']}",
                "source": s["name"],
                "where": "kind = 'update'",
                "channels": ["file"],
            }
            for s in sources
        ],
    }
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@contextmanager
def fresh_storage(pg_url: str, keep: bool) -> Iterator[tuple[str, str]]:
    """A database for Dagster's storage and one for the warehouse, as deploy/ has them: the
    psycopg2 URL of the one, the warehouse URL of the other; dropped afterwards unless
    ``keep`` (a whole database: dropping a schema of 2,000 tables in one transaction runs
    out of lock slots)."""
    name = f"bench_fleet_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(pg_url)
    admin = psycopg2.connect(pg_url)
    admin.autocommit = True
    created = []
    try:
        with admin.cursor() as cur:
            for db in (name, f"{name}_wh"):
                cur.execute(f'CREATE DATABASE "{db}"')
                created.append(db)
        dagster = urlunsplit(parts._replace(scheme="postgresql+psycopg2", path=f"/{name}"))
        warehouse = urlunsplit(parts._replace(path=f"/{name}_wh", query="schema=warehouse"))
        yield dagster, warehouse
    finally:
        if not keep:
            with admin.cursor() as cur:
                for db in created:
                    cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


# -- the processes ------------------------------------------------------------------------


@dataclass
class Deployment:
    """The code server and the daemon of one phase, and where their logs go."""

    code: subprocess.Popen
    daemon: subprocess.Popen | None
    logs: Path

    def roots(self) -> list[int]:
        return [self.daemon.pid, self.code.pid] if self.daemon else [self.code.pid]

    def check_alive(self) -> None:
        for name, proc in (("code server", self.code), ("daemon", self.daemon)):
            if proc is not None and proc.poll() is not None:
                tail = (self.logs / f"{name.split()[0]}.log").read_text()[-3000:]
                raise SystemExit(f"the {name} ended (exit {proc.returncode}):\n{tail}")
        if self.daemon is not None and len(proctree.snapshot([self.code.pid])) < 2:
            # The proxy stays up when the server it spawned ends, and does not start another:
            # sensors then fail at every tick. The server ends when it misses the proxy's
            # heartbeats for --heartbeat-ttl seconds (30 by default).
            raise SystemExit(
                "the code server's API server ended (its proxy is still up): see "
                f"{self.logs / 'code.log'}; --heartbeat-ttl gives it longer"
            )


def deploy_daemon_env() -> dict[str, str]:
    """The variables deploy/docker-compose.yml sets for the daemon alone (its command's
    ``env NAME=value ...`` prefix)."""
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    command = compose["services"]["daemon"]["command"]
    prefix = itertools.takewhile(
        lambda word: "=" in word, command[1:] if command[0] == "env" else []
    )
    return dict(word.split("=", 1) for word in prefix)


@contextmanager
def deployment(
    folder: Path,
    env: dict[str, str],
    limit: float,
    code_options: list[str],
    daemon_env: dict[str, str],
) -> Iterator[Deployment]:
    """deploy/'s one-off step, then its code server and, once that listens (as the compose
    file's health check waits), the daemon; on leaving, both are stopped with every process
    they started."""
    home = folder / "home"
    home.mkdir()
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO / "deploy" / name, home / name)
    port = free_port()
    env = env | {
        "DAGSTER_HOME": str(home),
        "CHANGEWATCH_CODE_HOST": "127.0.0.1",
        "CHANGEWATCH_CODE_PORT": str(port),
    }
    init = [str(BIN / "dagster"), "instance", "concurrency", "set", "warehouse/notifications", "1"]
    done = subprocess.run(init, env=env, cwd=home, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(init[1:])}` failed: {done.stderr.strip()[-1000:]}")
    code = [str(BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p", str(port)]
    code += ["-m", "changewatch.pipeline.definitions.code_location", *code_options]
    daemon = [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"]
    with ExitStack() as stack:

        def start(name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
            log = stack.enter_context((folder / f"{name}.log").open("w"))
            proc = subprocess.Popen(
                command, env=env, cwd=home, stdout=log, stderr=log, preexec_fn=die_with_parent
            )
            stack.callback(stop_tree, proc)
            return proc

        deploy = Deployment(code=start("code", code, env), daemon=None, logs=folder)
        deadline = time.time() + limit
        while not listening(port):
            deploy.check_alive()
            if time.time() > deadline:
                raise SystemExit(f"the code server did not listen within {limit:.0f} s")
            time.sleep(0.5)
        deploy.daemon = start("daemon", daemon, env | daemon_env)
        yield deploy


# -- sampling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """CPU seconds so far of each part (daemon, code server, runs) and RSS bytes now."""

    at: float
    cpu: dict[str, float]
    rss: dict[str, int]


def is_run_worker(pid: int, cache: dict[int, bool]) -> bool:
    # The code server spawns each run as a multiprocessing child of its server process.
    if pid not in cache:
        cache[pid] = "multiprocessing.spawn" in proctree.cmdline(pid)
    return cache[pid]


class Sampler:
    """Samples the deployment's processes every ``period`` seconds on a thread of its own."""

    def __init__(self, deploy: Deployment, period: float) -> None:
        self.deploy = deploy
        self.period = period
        self.samples: list[Sample] = []
        self.run_peak = 0  # the largest run worker's VmHWM
        self._workers: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def take(self) -> Sample:
        procs = proctree.snapshot(self.deploy.roots())
        daemon = proctree.tree(procs, [self.deploy.daemon.pid])
        code = proctree.tree(procs, [self.deploy.code.pid])
        workers = [p for p in code if is_run_worker(p, self._workers)]
        runs = proctree.tree(procs, workers)
        server = [p for pid, p in code.items() if pid not in runs]
        for pid in workers:
            self.run_peak = max(self.run_peak, proctree.hwm_bytes(pid))
        sample = Sample(
            at=time.time(),
            cpu={
                "daemon": sum(p.own + p.reaped for p in daemon.values()),
                "code server": sum(p.own for p in server),
                # Workers the server has reaped count through it.
                "runs": sum(p.own + p.reaped for p in runs.values())
                + sum(p.reaped for p in server),
            },
            rss={
                "daemon": sum(p.rss for p in daemon.values()),
                "code server": sum(p.rss for p in server),
                "run worker": max((runs[p].rss for p in workers), default=0),
            },
        )
        self.samples.append(sample)
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.take()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


# -- changes and notifications ------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One update made upstream: when, the sync that should pick it up, and the source and
    object key its notification will carry."""

    at: float
    sync: str
    source: str
    key: str


def change(shape: str, index: int, number: int) -> Change:
    """The change of issue ``number`` of the ``index``-th target, made now."""
    if shape == FLEET:  # the fleet's key is (repo, number)
        return Change(time.time(), sync_name(shape, index), FLEET, f"r{index:04d}|{number}")
    return Change(time.time(), sync_name(shape, index), sync_name(shape, index), str(number))


class Changer:
    """Updates one issue of a random target at even spacing; records when and which."""

    def __init__(
        self, trackers: list[DemoTracker], shape: str, per_minute: float, seed: int = 18
    ) -> None:
        self.trackers = trackers
        self.shape = shape
        self.spacing = 60.0 / per_minute if per_minute > 0 else float("inf")
        self.made: list[Change] = []
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="changer", daemon=True)

    def _loop(self) -> None:
        due = time.time()
        while not self._stop.wait(max(0.0, due - time.time())):
            index = self._rng.randrange(len(self.trackers))
            [number] = self.trackers[index].mutate(update=1)["updated"]
            self.made.append(change(self.shape, index, number))
            due += self.spacing

    def start(self) -> None:
        if self.spacing != float("inf"):
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class Tail:
    """New lines of the notification file, each stamped with when this bench first saw it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[float, str, str, str]] = []  # (epoch, source, key, kind)
        self._offset = 0
        self._partial = b""

    def read(self) -> None:
        if not self.path.exists():
            return
        now = time.time()
        with self.path.open("rb") as lines:
            lines.seek(self._offset)
            data = self._partial + lines.read()
            self._offset = lines.tell()
        *whole, self._partial = data.split(b"\n")
        for line in whole:
            note = json.loads(line)
            self.seen.append((now, note["source"], object_key(note["object_key"]), note["kind"]))


def object_key(text: str) -> str:
    """A notification's object key as ``change`` writes it: a fleet's composite key (JSON,
    target first) as ``<repo>|<number>``.

    >>> object_key("23"), object_key('{"repo":"r0001","number":23}')
    ('23', 'r0001|23')
    """
    if not text.startswith("{"):
        return text
    return "|".join(str(v) for v in json.loads(text).values())


def latencies(
    made: list[Change], seen: list[tuple[float, str, str, str]]
) -> tuple[list[float], int]:
    """Seconds from each change to its notification, and how many had none.

    A notification of an object answers every change of it made before (two updates of one
    issue before a sync are one change).
    """
    arrivals: dict[tuple[str, str], list[float]] = {}
    for at, source, key, kind in seen:
        if kind == "update":
            arrivals.setdefault((source, key), []).append(at)
    found, missing = [], 0
    for c in made:
        later = [t for t in arrivals.get((c.source, c.key), []) if t >= c.at]
        if later:
            found.append(min(later) - c.at)
        else:
            missing += 1
    return found, missing


# -- what the databases say ---------------------------------------------------------------


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg2://", "postgresql://").split("?")[0]


def query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(psycopg2.connect(plain(url))) as con, con.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def warehouse_query(warehouse: str, sql: str, params: tuple = ()) -> list[tuple]:
    schema = warehouse.split("schema=", 1)[1]
    with closing(psycopg2.connect(plain(warehouse))) as con, con.cursor() as cur:
        cur.execute(f'SET search_path TO "{schema}"')
        try:
            cur.execute(sql, params)
        except psycopg2.errors.UndefinedTable:
            return []  # no sync has created its bookkeeping yet
        return cur.fetchall()


def synced_sources(warehouse: str) -> int:
    rows = warehouse_query(
        warehouse, "SELECT count(DISTINCT source) FROM sync_runs WHERE status = 'succeeded'"
    )
    return rows[0][0] if rows else 0


def runs_busy(dagster: str) -> int:
    [(busy,)] = query(
        dagster,
        "SELECT count(*) FROM runs WHERE status IN "
        "('QUEUED', 'NOT_STARTED', 'STARTING', 'STARTED', 'CANCELING')",
    )
    return busy


def dagster_runs(dagster: str, start: float, end: float) -> list[tuple[str, str, str, float]]:
    """Runs created in [start, end): (run id, status, trigger tag, created epoch)."""
    return query(
        dagster,
        "SELECT r.run_id, r.status, coalesce(t.value, r.pipeline_name), "
        "EXTRACT(EPOCH FROM r.create_timestamp AT TIME ZONE 'UTC')::float8 FROM runs r "
        "LEFT JOIN run_tags t ON t.run_id = r.run_id AND t.key = %s "
        "WHERE r.create_timestamp AT TIME ZONE 'UTC' >= to_timestamp(%s) "
        "AND r.create_timestamp AT TIME ZONE 'UTC' < to_timestamp(%s)",
        (TRIGGER_TAG, start, end),
    )


def syncs(warehouse: str, start: float, end: float) -> list[tuple[str, str, str, float, int]]:
    """Syncs started in [start, end): (source, run id, status, started epoch, requests)."""
    return warehouse_query(
        warehouse,
        "SELECT source, dagster_run_id, status, EXTRACT(EPOCH FROM started_at)::float8, "
        "coalesce(requests, 0) FROM sync_runs "
        "WHERE started_at >= to_timestamp(%s) AND started_at < to_timestamp(%s)",
        (start, end),
    )


def notice_delays(made: list[Change], dagster: str, warehouse: str, end: float) -> list[float]:
    """Seconds from each change to the creation of the first later run syncing its source."""
    if not made:
        return []
    start = made[0].at
    created = {run: at for run, *_, at in dagster_runs(dagster, start, end)}
    runs_of: dict[str, list[float]] = {}
    for source, run, *_ in syncs(warehouse, start, end):
        if run in created:
            runs_of.setdefault(source, []).append(created[run])
    delays = []
    for c in made:
        later = [t for t in runs_of.get(c.sync, []) if t >= c.at]
        if later:
            delays.append(min(later) - c.at)
    return delays


def unchanged_syncs(
    made: list[Change], done: list[tuple[str, str, str, float, int]], since: float
) -> int:
    """Syncs started after ``since`` of a source with no change made since its previous sync
    (a run a probe should have spared; a reconciliation is one)."""
    changes: dict[str, list[float]] = {}
    for c in made:
        changes.setdefault(c.sync, []).append(c.at)
    previous: dict[str, float] = {}
    wasted = 0
    for source, _, _, started, _ in sorted(done, key=lambda s: s[3]):
        before = previous.get(source)
        if started >= since and before is not None:
            wasted += not any(before < at <= started for at in changes.get(source, []))
        previous[source] = started
    return wasted


# -- a phase ------------------------------------------------------------------------------


@dataclass
class Figures:
    """What one phase measured over its window."""

    label: str
    window_s: float
    polls_due: int = 0
    probes: int = 0
    runs: int = 0
    runs_failed: int = 0
    triggers: dict[str, int] = field(default_factory=dict)
    syncs_unchanged: int = 0
    syncs: int = 0
    syncs_failed: int = 0
    changes: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    notice: list[float] = field(default_factory=list)
    notified: list[float] = field(default_factory=list)
    missing: int = 0
    rss_peak: dict[str, int] = field(default_factory=dict)
    rss_spans: list[dict[str, int]] = field(default_factory=list)
    bound_s: float = 0.0

    @property
    def polls(self) -> int:
        """Polls done: probes, or for the one-run-per-source path its runs."""
        return self.probes or self.runs

    @property
    def total_cpu(self) -> float:
        return sum(self.cpu.values())


def wait_for(
    what: str, done: Callable[[], bool], deploy: Deployment, tail: Tail | None, limit: float
) -> None:
    """Poll ``done`` (and the notification file) until true; fail after ``limit`` seconds or
    when a process of the deployment ends."""
    deadline = time.time() + limit
    while not done():
        deploy.check_alive()
        if tail is not None:
            tail.read()
        if time.time() > deadline:
            raise SystemExit(f"{what}: not within {limit:.0f} s (logs in {deploy.logs})")
        time.sleep(1.0)


def polls_due(
    shape: str, count: int, interval: float, jitter: float, start: float, end: float
) -> int:
    """Interval slots begun in [start, end) over ``count`` targets: the probes due."""
    due = 0
    for i in range(count):
        offset = jitter_offset(sync_name(shape, i), jitter)
        due += int((end - offset) // interval) - int((start - offset) // interval)
    return due


def rss_spans(samples: list[Sample], start: float, end: float) -> tuple[dict, list[dict]]:
    """Peak RSS per part over the window, and over each of its spans in turn (5 minutes, or
    halves of a shorter window): a trend that shows growth, or a plateau."""

    def peak(lo: float, hi: float) -> dict[str, int]:
        inside = [s for s in samples if lo <= s.at <= hi]
        return {k: max((s.rss[k] for s in inside), default=0) for k in LONG_LIVED}

    count = max(2, round((end - start) / FLAT_SPAN_S))
    bounds = [start + (end - start) * i / count for i in range(count + 1)]
    return peak(start, end), [peak(lo, hi) for lo, hi in itertools.pairwise(bounds)]


def second_half_growth(spans: list[dict[str, int]], part: str) -> float:
    """How much ``part``'s peak RSS grew over the window's second half (0.03: 3%)."""
    middle = spans[len(spans) // 2 - 1][part]  # the span ending at (or nearest) the half
    return spans[-1][part] / middle - 1 if middle else float("nan")


@dataclass
class Running:
    """One phase's API, storage and deployment, while they run."""

    api: DemoAPIServer
    dagster: str
    warehouse: str
    deploy: Deployment
    sampler: Sampler
    tail: Tail


@contextmanager
def running(
    args: argparse.Namespace, folder: Path, trackers: list[DemoTracker], config: Callable
) -> Iterator[Running]:
    """The API serving ``trackers``, fresh storage, and a deployment of the watches file
    ``config(base_url)`` writes, sampled; all stopped and dropped on leaving."""
    with ExitStack() as stack:
        api = stack.enter_context(DemoAPIServer(trackers[0], more=trackers[1:]))
        dagster, warehouse = stack.enter_context(fresh_storage(args.pg_url, args.keep))
        env = dict(os.environ) | {
            "DAGSTER_PG_URL": dagster,
            "CHANGEWATCH_CONFIG": str(config(api.url)),
            "CHANGEWATCH_WAREHOUSE_URL": warehouse,
        }
        options = ["--heartbeat-ttl", str(args.heartbeat_ttl)] if args.heartbeat_ttl else []
        daemon_env = deploy_daemon_env() if args.malloc == "deploy" else {}
        deploy = stack.enter_context(
            deployment(folder, env, args.warmup_limit, options, daemon_env)
        )
        sampler = stack.enter_context(Sampler(deploy, args.sample))
        yield Running(
            api, dagster, warehouse, deploy, sampler, Tail(folder / "notifications.jsonl")
        )


def warm_up(run: Running, label: str, count: int, limit: float) -> None:
    """Until every target's first sync is done (its first probe always says "changed")."""
    began = time.time()
    wait_for(
        f"{label}: the first sync of every target",
        lambda: synced_sources(run.warehouse) == count and runs_busy(run.dagster) == 0,
        run.deploy,
        run.tail,
        limit,
    )
    print(f"  {label}: warm-up (first syncs) took {time.time() - began:.0f} s", flush=True)


def count_runs(figures: Figures, runs: list[tuple[str, str, str, float]]) -> None:
    figures.runs = len(runs)
    figures.runs_failed = sum(1 for r in runs if r[1] != "SUCCESS")
    for _, _, trigger, _ in runs:
        figures.triggers[trigger] = figures.triggers.get(trigger, 0) + 1


def count_syncs(figures: Figures, run: Running, first: Sample, last: Sample) -> None:
    figures.window_s = last.at - first.at
    figures.cpu = {k: last.cpu[k] - first.cpu[k] for k in last.cpu}
    count_runs(figures, dagster_runs(run.dagster, first.at, last.at))
    done = syncs(run.warehouse, first.at, last.at)
    figures.syncs = len(done)
    figures.syncs_failed = sum(1 for s in done if s[2] != "succeeded")
    figures.rss_peak, figures.rss_spans = rss_spans(run.sampler.samples, first.at, last.at)
    figures.rss_peak["run worker"] = run.sampler.run_peak


def probed_phase(
    args: argparse.Namespace, shape: str, count: int, minutes: float, tick: float, folder: Path
) -> Figures:
    """N probed targets (plain sources or one fleet) with changes: the issue's figures."""
    interval = args.interval
    jitter = args.jitter if args.jitter is not None else interval * 0.95
    trackers = [
        DemoTracker(issues=args.issues, seed=i, repo=f"acme/r{i:04d}") for i in range(count)
    ]
    label = f"{count:,} {'sources' if shape == 'plain' else 'fleet targets'}, tick {tick:g} s"
    bound = interval + jitter + tick
    figures = Figures(label=label, window_s=0.0, bound_s=bound)

    def config(url: str) -> Path:
        return watches_file(folder, url, count, interval, jitter, shape=shape, tick=tick)

    with running(args, folder, trackers, config) as run:
        began = time.time()
        warm_up(run, label, count, args.warmup_limit)
        changer = Changer(trackers, shape, count * args.change_rate)
        changer.start()
        settle_end = time.time() + interval  # changes noticed as fast as they come: steady
        wait_for("settling", lambda: time.time() >= settle_end, run.deploy, run.tail, interval + 60)
        first, requests_before = run.sampler.take(), run.api.stats()["requests"]
        end = first.at + minutes * 60
        wait_for("the window", lambda: time.time() >= end, run.deploy, run.tail, end - began)
        last, requests_after = run.sampler.take(), run.api.stats()["requests"]
        changer.stop()
        # The last changes' notifications: each within the bound, plus its run.
        drain_end = time.time() + bound + 5 * tick
        wait_for(
            "the last notifications",
            lambda: (
                latencies(changer.made, run.tail.seen)[1] == 0
                or (time.time() > drain_end and runs_busy(run.dagster) == 0)
            ),
            run.deploy,
            run.tail,
            bound + 60 * tick,
        )
        run.tail.read()
        count_syncs(figures, run, first, last)
        sync_requests = sum(s[4] for s in syncs(run.warehouse, first.at, last.at))
        figures.probes = requests_after - requests_before - sync_requests
        figures.polls_due = polls_due(shape, count, interval, jitter, first.at, last.at)
        figures.changes = len(changer.made)
        figures.syncs_unchanged = unchanged_syncs(
            changer.made, syncs(run.warehouse, began, last.at), first.at
        )
        figures.notified, figures.missing = latencies(changer.made, run.tail.seen)
        figures.notice = notice_delays(changer.made, run.dagster, run.warehouse, time.time())
    return figures


def baseline_phase(args: argparse.Namespace, folder: Path) -> Figures:
    """Today's one-run-per-source path: one source, no probe, a run at every interval."""
    interval = args.baseline_interval
    label = "one run per poll"
    figures = Figures(label=label, window_s=0.0)
    trackers = [DemoTracker(issues=args.issues, seed=0, repo="acme/r0000")]

    def config(url: str) -> Path:
        return watches_file(folder, url, 1, interval, 0.0, probe=False)

    with running(args, folder, trackers, config) as run:
        warm_up(run, label, 1, args.warmup_limit)
        first = run.sampler.take()

        def finished() -> bool:
            runs = dagster_runs(run.dagster, first.at, time.time())
            return len(runs) >= args.baseline_polls and runs_busy(run.dagster) == 0

        limit = args.baseline_polls * (interval + 10 * TICK_S)
        wait_for(f"{label}: {args.baseline_polls} runs", finished, run.deploy, None, limit)
        count_syncs(figures, run, first, run.sampler.take())
    return figures


# -- the report ---------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def rows(f: Figures, cores: int) -> dict[str, str]:
    per_poll = f.total_cpu / f.polls if f.polls else float("nan")
    share = f.total_cpu / (f.window_s * cores) if f.window_s else float("nan")
    mib = {k: v / MIB for k, v in f.rss_peak.items()}
    out = {
        "window": f"{f.window_s / 60:.1f} min",
        "polls done / due": f"{f.probes:,} / {f.polls_due:,}" if f.probes else f"{f.runs} runs",
        "changes made": f"{f.changes:,}",
        "runs started (failed)": f"{f.runs:,} ({f.runs_failed})",
        "runs by trigger": ", ".join(f"{k} {v}" for k, v in sorted(f.triggers.items())) or "-",
        "syncs done (failed)": f"{f.syncs:,} ({f.syncs_failed})",
        "syncs with no change upstream": f"{f.syncs_unchanged}" if f.changes else "-",
        "CPU s daemon / code / runs": " / ".join(f"{f.cpu[k]:.1f}" for k in f.cpu),
        "core-s per poll, all included": f"{per_poll:.3f}",
        f"% of machine ({cores} cores)": f"{share * 100:.1f}%",
        "code server ms CPU per probe": (
            f"{f.cpu['code server'] * 1000 / f.probes:.1f}" if f.probes else "-"
        ),
        "runs core-s per run": f"{f.cpu['runs'] / f.runs:.2f}" if f.runs else "-",
        "change->run requested p50/p95 s": (
            f"{pct(f.notice, 50):.0f} / {pct(f.notice, 95):.0f}" if f.notice else "-"
        ),
        "change->notification p50/p95/max s": (
            f"{pct(f.notified, 50):.0f} / {pct(f.notified, 95):.0f} / {max(f.notified):.0f}"
            if f.notified
            else "-"
        ),
        "notifications missing": f"{f.missing}" if f.changes else "-",
        "RSS peak MiB daemon / code / run": " / ".join(
            f"{mib.get(k, 0):.0f}" for k in ("daemon", "code server", "run worker")
        ),
        "RSS peak MiB by span: span": _duration(f.window_s / max(len(f.rss_spans), 1)),
        "  daemon": " ".join(f"{p['daemon'] / MIB:.0f}" for p in f.rss_spans),
        "  code server": " ".join(f"{p['code server'] / MIB:.0f}" for p in f.rss_spans),
    }
    return out


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def summary(f: Figures, cores: int) -> dict:
    """A phase's figures as JSON-able data (``--json``)."""
    data = {k: v for k, v in vars(f).items() if k not in ("notice", "notified")}
    data["core_s_per_poll"] = f.total_cpu / f.polls if f.polls else None
    data["machine_share"] = f.total_cpu / (f.window_s * cores) if f.window_s else None
    for name, values in (("notice", f.notice), ("notified", f.notified)):
        data[f"{name}_p50"] = pct(values, 50) if values else None
        data[f"{name}_p95"] = pct(values, 95) if values else None
    return data


def report(phases: list[Figures], cores: int) -> None:
    table = [rows(f, cores) for f in phases]
    names = list(table[0])
    width = max(len(n) for n in names)
    cols = [
        max(len(f.label), *(len(t[n]) for n in names)) for f, t in zip(phases, table, strict=True)
    ]
    print()
    print(
        " " * width + "  " + "  ".join(f.label.rjust(c) for f, c in zip(phases, cols, strict=True))
    )
    for name in names:
        print(
            name.ljust(width)
            + "  "
            + "  ".join(t[name].rjust(c) for t, c in zip(table, cols, strict=True))
        )
    print()
    for f in phases:
        if not f.probes:
            continue
        per_poll = f.total_cpu / f.probes
        share = f.total_cpu / (f.window_s * cores)
        probe_ms = f.cpu["code server"] * 1000 / f.probes
        late = sum(1 for d in f.notice if d > f.bound_s)
        growth = {k: second_half_growth(f.rss_spans, k) for k in LONG_LIVED}
        for ok, text in (
            (
                per_poll <= TARGET_CORE_S_PER_POLL,
                f"{per_poll:.3f} core-s per poll (target {TARGET_CORE_S_PER_POLL})",
            ),
            (
                share <= TARGET_MACHINE_SHARE,
                f"{share * 100:.1f}% of the machine (target {TARGET_MACHINE_SHARE * 100:.0f}%)",
            ),
            (
                probe_ms <= TARGET_PROBE_MS,
                f"{probe_ms:.1f} ms code server CPU per probe (target {TARGET_PROBE_MS:g})",
            ),
            (
                f.probes >= 0.95 * f.polls_due,
                f"{f.probes:,} probes of {f.polls_due:,} due (schedule held at 95%)",
            ),
            (
                late == 0 and f.missing == 0,
                f"{late} changes noticed later than interval+jitter+tick ({f.bound_s:.0f} s), "
                f"{f.missing} never notified",
            ),
            (
                max(growth.values()) <= TARGET_FLAT,
                "memory over the window's second half: "
                + ", ".join(f"{k} {v * 100:+.1f}%" for k, v in growth.items())
                + f" (flat: at most {TARGET_FLAT * 100:+.0f}%)",
            ),
        ):
            print(f"{'TARGET MET' if ok else 'TARGET MISSED'}: {f.label}: {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--shape",
        nargs="+",
        choices=SHAPES,
        default=["plain"],
        help="N plain sources (a watch each), and/or one fleet source of N targets",
    )
    parser.add_argument("--interval", type=float, default=300.0, help="seconds between polls")
    parser.add_argument("--jitter", type=float, help="seconds (default 0.95 x interval)")
    parser.add_argument(
        "--minutes",
        type=float,
        nargs="+",
        default=[10.0],
        help="the measured window: one value, or one per --sources count",
    )
    parser.add_argument(
        "--tick",
        type=float,
        nargs="+",
        default=[TICK_S],
        help="seconds between the sync sensors' ticks (the watches file's polling: tick): "
        "one value, or one per --sources count",
    )
    parser.add_argument(
        "--change-rate", type=float, default=0.05, help="share of the sources changing each minute"
    )
    parser.add_argument("--issues", type=int, default=40, help="issues per source")
    parser.add_argument("--baseline-interval", type=float, default=60.0)
    parser.add_argument("--baseline-polls", type=int, default=3, help="0 skips the baseline")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--warmup-limit", type=float, default=3600.0)
    parser.add_argument(
        "--heartbeat-ttl",
        type=int,
        help="seconds the code server's API server waits for its proxy's heartbeat "
        "(dagster code-server start --heartbeat-ttl; Dagster's default 30)",
    )
    parser.add_argument(
        "--pg-url", default=os.environ.get("CHANGEWATCH_TEST_PG_URL", DEFAULT_PG_URL)
    )
    parser.add_argument(
        "--malloc",
        choices=["deploy", "glibc"],
        default="deploy",
        help="the daemon's allocator settings of deploy/docker-compose.yml, or glibc's defaults",
    )
    parser.add_argument("--keep", action="store_true", help="keep databases and logs")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    windows = args.minutes * len(args.sources) if len(args.minutes) == 1 else args.minutes
    if len(windows) != len(args.sources):
        parser.error("--minutes takes one value, or one per --sources count")
    ticks = args.tick * len(args.sources) if len(args.tick) == 1 else args.tick
    if len(ticks) != len(args.sources):
        parser.error("--tick takes one value, or one per --sources count")
    # A TERM (Ctrl-C too) unwinds the phase: processes stopped, databases dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench_fleet: terminated"))
    cores = os.cpu_count() or 1
    print(
        f"bench_fleet: interval {args.interval:g} s, "
        f"window {'/'.join(f'{m:g}' for m in args.minutes)} min, "
        f"tick {'/'.join(f'{t:g}' for t in args.tick)} s, "
        f"{args.change_rate * 100:g}% of sources changing a minute, {args.issues} issues "
        f"each; daemon's malloc: {deploy_daemon_env() if args.malloc == 'deploy' else 'glibc'}; "
        f"{cores} cores, load average {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    phases = []
    tmp = tempfile.mkdtemp(prefix="bench_fleet_")
    try:
        for shape in args.shape:
            for i, (count, minutes, tick) in enumerate(
                zip(args.sources, windows, ticks, strict=True)
            ):
                folder = Path(tmp) / f"{shape}{i}_{count}"
                folder.mkdir()
                phases.append(probed_phase(args, shape, count, minutes, tick, folder))
                print(f"  {phases[-1].label}: done", flush=True)
        if args.baseline_polls:
            folder = Path(tmp) / "baseline"
            folder.mkdir()
            phases.append(baseline_phase(args, folder))
    finally:
        if args.keep:
            print(f"logs and files kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report(phases, cores)
    if args.json:
        args.json.write_text(json.dumps([summary(f, cores) for f in phases], indent=1))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
