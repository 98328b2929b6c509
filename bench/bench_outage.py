"""Delivery through a receiver's bad day: a 24-hour outage, a 410, a flapping receiver.

A webhook channel posts to a real receiver on loopback; the clock is simulated (``deliver_due``
takes ``now``), so a day of outage costs seconds, not a day. Every ``--tick`` simulated
seconds a delivery pass runs, as the scheduler's notifications asset would. Three scenarios:

* outage: the receiver is down (nothing listens on its port) for ``--hours`` while
  ``--notifications`` notifications about ``--objects`` objects are queued, spread over the
  outage; then it comes back. Every notification must arrive exactly once, in order per object.
* gone: the receiver answers 410 to everything; the channel must be disabled after one
  attempt and nothing more sent for the rest of the day.
* flapping: the receiver answers 503 to half the requests (seeded), taking only the others;
  every notification must arrive, with no duplicate (a 503 means it was not taken), and a
  receiver keeping the highest sequence per object must end with each object's newest.

Prints one line per scenario and ``ALL MET`` or ``MISSED``. Run from the repository root::

    .venv/bin/python bench/bench_outage.py                       # DuckDB, 1,000 over 24 h
    .venv/bin/python bench/bench_outage.py --backend postgres --notifications 200
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The delivery tests' helper that queues notifications as an evaluation commits them.
sys.path.insert(0, str(REPO / "tests" / "channels"))

from changewatch.channels.circuit import load_circuits  # noqa: E402
from changewatch.channels.config import RetryConfig, WebhookChannelConfig  # noqa: E402
from changewatch.channels.outbox import DeliveryPolicy, deliver_due  # noqa: E402
from changewatch.warehouse.backends import connect  # noqa: E402
from queued import enqueue  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
START = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Receiver:
    """A webhook receiver on a fixed loopback port: ``down`` (not listening), ``up``,
    ``gone`` (410) or ``flapping`` (503 half the time). Records what it took and every hit."""

    mode: str = "up"
    taken: list[dict[str, Any]] = field(default_factory=list)
    hits: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def listen(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                with receiver.lock:
                    receiver.hits += 1
                    status = {"up": 200, "gone": 410}.get(receiver.mode, 200)
                    if receiver.mode == "flapping" and receiver.rng.random() < 0.5:
                        status = 503
                    if status == 200:
                        receiver.taken.append(json.loads(body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop listening: a send meets a refused connection, as to a host that is down."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None


@dataclass
class Outcome:
    name: str
    met: bool
    line: str


def warehouse_url(backend: str, pg_url: str, folder: Path) -> tuple[str, Callable[[], None]]:
    """A fresh warehouse URL and how to throw it away."""
    if backend == "duckdb":
        return f"duckdb:///{folder / f'{uuid.uuid4().hex}.duckdb'}", lambda: None
    schema = f"bench_{uuid.uuid4().hex[:12]}"

    def drop() -> None:
        import adbc_driver_postgresql.dbapi as adbc

        with adbc.connect(pg_url) as con, con.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            con.commit()

    return f"{pg_url}?schema={schema}", drop


def changes(count: int, objects: int) -> list[tuple[str, int]]:
    """(object_key, change_id) of ``count`` changes, round-robin over ``objects`` objects;
    change ids grow, as a source's change log does."""
    return [(f"obj{n % objects:04d}", n + 1) for n in range(count)]


def in_order(taken: list[dict[str, Any]]) -> int:
    """Arrivals older (lower sequence) than one already taken about the same object."""
    newest: dict[str, int] = {}
    stale = 0
    for payload in taken:
        key = payload["object_key"]
        if payload["sequence"] < newest.get(key, 0):
            stale += 1
        newest[key] = max(newest.get(key, 0), payload["sequence"])
    return stale


class Run:
    """One scenario's warehouse, channel, simulated clock and pass counter."""

    def __init__(self, wh: Any, receiver: Receiver, policy: DeliveryPolicy) -> None:
        self.wh, self.receiver, self.policy = wh, receiver, policy
        self.channel = WebhookChannelConfig(
            name="hook", type="webhook", url=f"http://127.0.0.1:{receiver.port}/h", timeout=5
        )
        self.now = START
        self.passes = 0

    def deliver(self) -> None:
        deliver_due(self.wh, [self.channel], policy=self.policy, now=lambda: self.now)
        self.passes += 1

    def advance(self, tick: float) -> None:
        """On to the next pass: a tick later, or later still when nothing falls due before
        (a pass then would do nothing: the scheduler's idle passes are skipped, not slept)."""
        soonest = self.now + timedelta(seconds=tick)
        circuit = load_circuits(self.wh).get("hook")
        if circuit is not None and circuit.state == "paused" and circuit.probe_at:
            event = circuit.probe_at
        else:
            [(event,)] = self.wh.fetch(
                "SELECT min(next_attempt_at) FROM deliveries WHERE status = 'pending'"
            )
        self.now = max(soonest, event) if event is not None else soonest

    def queue(self, batch: list[tuple[str, int]]) -> None:
        enqueue(self.wh, ["hook"], batch, at=self.now)

    def statuses(self) -> dict[str, int]:
        rows = self.wh.fetch("SELECT status, count(*) FROM deliveries GROUP BY status")
        return {status: int(count) for status, count in rows}

    def state(self) -> str:
        circuit = load_circuits(self.wh).get("hook")
        return circuit.state if circuit else "open"


def outage(args: argparse.Namespace, wh: Any) -> Outcome:
    receiver = Receiver()
    receiver.listen()
    receiver.close()  # the port is known, nothing listens: down
    run = Run(wh, receiver, DeliveryPolicy(rng=random.Random(1)))
    todo = changes(args.notifications, args.objects)
    ticks = int(args.hours * 3600 / args.tick)
    started = time.perf_counter()
    for tick in range(ticks):
        # Notifications keep coming during the outage, evenly over it.
        share = todo[len(todo) * tick // ticks : len(todo) * (tick + 1) // ticks]
        if share:
            run.queue(share)
        run.deliver()
        run.now += timedelta(seconds=args.tick)
    during = run.statuses()
    paused = run.state()
    receiver.mode = "up"
    receiver.listen()
    back = run.now
    while run.statuses().get("sent", 0) < len(todo) and run.now < back + timedelta(days=3):
        run.advance(args.tick)
        run.deliver()
    wall = time.perf_counter() - started
    receiver.close()
    ids = Counter(p["notification_id"] for p in receiver.taken)
    stale = in_order(receiver.taken)
    arrived, dupes = len(ids), sum(ids.values()) - len(ids)
    drained = (run.now - back).total_seconds() / 3600
    met = arrived == len(todo) and dupes == 0 and stale == 0 and during.get("dead", 0) == 0
    line = (
        f"outage {args.hours:g} h, {len(todo):,} notifications on {args.objects} objects: "
        f"circuit {paused} during it; {during.get('pending', 0):,} waiting, "
        f"{during.get('dead', 0)} dead at its end; after it {arrived:,} arrived, {dupes} "
        f"duplicate(s), {stale} out of order per object, all within {drained:.1f} simulated h "
        f"of its return; {run.passes} passes, {wall:.1f} s wall"
    )
    return Outcome("outage", met, line)


def gone(args: argparse.Namespace, wh: Any) -> Outcome:
    receiver = Receiver(mode="gone")
    receiver.listen()
    run = Run(wh, receiver, DeliveryPolicy(rng=random.Random(2)))
    run.queue(changes(args.notifications, args.objects))
    run.deliver()
    after_first = receiver.hits
    for _ in range(int(24 * 3600 / args.tick)):
        run.now += timedelta(seconds=args.tick)
        run.deliver()
    receiver.close()
    waiting = run.statuses().get("pending", 0)
    state = run.state()
    met = after_first == 1 and receiver.hits == 1 and state == "disabled"
    line = (
        f"410 gone, {args.notifications:,} queued: {after_first} request(s) on the first pass, "
        f"{receiver.hits} over 24 simulated h; channel {state}, {waiting:,} waiting for "
        "`changewatch resume --channel`"
    )
    return Outcome("gone", met, line)


def flapping(args: argparse.Namespace, wh: Any) -> Outcome:
    receiver = Receiver(mode="flapping")
    receiver.listen()
    run = Run(wh, receiver, DeliveryPolicy(rng=random.Random(3)))
    todo = changes(args.notifications, args.objects)
    run.queue(todo)
    started = time.perf_counter()
    run.deliver()
    # Until every notification is settled: sent, or dead-lettered once its schedule is spent.
    while run.statuses().get("pending", 0) and run.now < START + timedelta(days=10):
        run.advance(args.tick)
        run.deliver()
    wall = time.perf_counter() - started
    receiver.close()
    ids = Counter(p["notification_id"] for p in receiver.taken)
    arrived, dupes = len(ids), sum(ids.values()) - len(ids)
    stale = in_order(receiver.taken)
    newest: dict[str, dict[str, Any]] = {}
    for payload in receiver.taken:  # what a receiver keeping the highest sequence ends with
        key = payload["object_key"]
        if key not in newest or payload["sequence"] > newest[key]["sequence"]:
            newest[key] = payload
    last = {}
    for key, change in todo:
        last[key] = change
    right = sum(newest[k]["sequence"] == last[k] for k in last if k in newest)
    dead = run.statuses().get("dead", 0)
    met = arrived == len(todo) and dupes == 0 and dead == 0 and right == len(last)
    line = (
        f"flapping (50% 503), {len(todo):,} notifications: {receiver.hits:,} requests, "
        f"{arrived:,} arrived, {dupes} duplicate(s), {dead} dead, {stale} arrived after a "
        f"newer one (dropped by sequence: {right}/{len(last)} objects end on their newest), "
        f"drained in {(run.now - START).total_seconds() / 3600:.1f} simulated h; "
        f"{run.passes} passes, {wall:.1f} s wall"
    )
    return Outcome("flapping", met, line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["duckdb", "postgres"], default="duckdb")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--notifications", type=int, default=1000)
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--hours", type=float, default=24.0, help="simulated outage")
    parser.add_argument("--tick", type=float, default=300.0, help="simulated s between passes")
    parser.add_argument(
        "--scenario", action="append", choices=["outage", "gone", "flapping"], default=None
    )
    args = parser.parse_args(argv)
    retry = RetryConfig()
    print(
        f"{args.backend}: schedule {', '.join(f'{d:g}s' for d in retry.delays)} "
        f"(jitter {retry.jitter:g}, pause after {retry.pause_after}), a pass every "
        f"{args.tick:g} simulated s"
    )
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        for scenario in args.scenario or ["outage", "gone", "flapping"]:
            url, drop = warehouse_url(args.backend, args.pg_url, Path(folder))
            try:
                with connect(url) as wh:
                    outcome = {"outage": outage, "gone": gone, "flapping": flapping}[scenario](
                        args, wh
                    )
            finally:
                drop()
            print(f"{args.backend} {outcome.line}: {'met' if outcome.met else 'MISSED'}")
            outcomes.append(outcome)
    print("ALL MET" if all(o.met for o in outcomes) else "MISSED")
    return 0 if all(o.met for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
