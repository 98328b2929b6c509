"""Webhooks on several hosts: the receiver on the control host, its inbox in PostgreSQL on the
db host, killed while a provider on the api host sends signed deliveries.

The hosts of tests/hosts/deployment.py (network namespaces; root only): ``db`` (PostgreSQL:
Dagster's storage, the warehouse, and so the webhook inbox), ``control`` (Redis, the daemon
and ``changewatch webhooks``, with no ``CHANGEWATCH_WEBHOOK_INBOX``: its inbox is the table in
Dagster's database), two ``worker`` hosts (Celery) and ``api`` (the demo trackers, and the
sink that the watches' webhook channel posts to). Each source takes Standard Webhooks and is
polled only to reconcile, hourly, so webhooks alone bring its changes in the window.

The provider, on the api host: ``--deliveries`` events at ``--rate`` a second, each an update
of one issue of a random tracker and a delivery signed with the ``standardwebhooks`` library
(its own implementation, not ours), POSTed by one of a pool of sender threads and retried, as
a provider does, until the receiver answers it with a 2xx (after 0.5 s, doubling to 5 s; the
signature made anew each time, the delivery id kept). The receiver is SIGKILLed ``--kills``
times, evenly spaced among the deliveries (at 1/3 and 2/3 for 2), and started again
``--down`` seconds later.

Printed: deliveries acknowledged (and not), answered as duplicates (a delivery stored, then the
receiver killed before its answer reached the provider: the retry is a 200, nothing new);
acknowledged deliveries missing from the inbox, and whose change (that issue at that
``updated_at`` or later) was never recorded in the warehouse (target: 0); changes recorded
twice and notifications posted under an id posted before; POST -> notification p50/p95/max
(the delivery's first POST to the first webhook POST at the sink about that issue at that
version or later; target p95 <= 10 s), and apart for the deliveries sent within 30 s of a
kill; the receiver's time down per kill; runs by trigger and their outcome; the load average.

    sudo .venv/bin/python bench/bench_hosts_webhooks.py                   # 2,000, 2 kills

tests/hosts/test_bench_hosts_webhooks.py runs a small one.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
from standardwebhooks import Webhook

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "hosts"), str(REPO / "tests"), str(REPO / "bench")]

from bench_hosts import pct  # noqa: E402
from deployment import Deployment, changes, delivered  # noqa: E402

TARGET_P95_S = 10.0
NEAR_KILL_S = 30.0  # deliveries first POSTed this soon after a kill are reported apart
GIVE_UP_S = 300.0  # a provider's patience: a delivery not acknowledged by then is given up
RESTART_LIMIT_S = 120.0  # the receiver not listening this long after a kill: it failed


def epoch(value: object) -> float:
    """Seconds since the epoch of an ISO timestamp or a datetime, naive ones being UTC.

    >>> epoch("2026-01-01T00:00:00Z"), epoch("2026-01-01 00:00:00")
    (1767225600.0, 1767225600.0)
    """
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(
        str(value).replace("Z", "+00:00")
    )  # fmt: skip
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass
class Delivery:
    """One event of the provider: the issue it changed, and what became of its POSTs."""

    delivery_id: str
    source: str
    number: int
    updated: float  # the issue's updated_at after the change
    first_post: float = 0.0
    acked: float | None = None
    answers: list[int | str] = field(default_factory=list)


class Provider:
    """Changes the trackers and sends their signed deliveries, from the api host."""

    def __init__(self, d: Deployment, senders: int) -> None:
        self.d = d
        self.signer = Webhook(d.hook_secret)
        self.todo: queue.Queue[Delivery | None] = queue.Queue()
        self.sent: list[Delivery] = []
        self.threads = [
            threading.Thread(target=self._send_loop, name=f"sender-{i}", daemon=True)
            for i in range(senders)
        ]
        for thread in self.threads:
            thread.start()

    def event(self, index: int, rng: random.Random) -> Delivery:
        """Update one issue of a random tracker; queue its delivery."""
        source = rng.choice(sorted(self.d.trackers))
        tracker = self.d.trackers[source].tracker
        [number] = tracker.mutate(update=1)["updated"]
        updated = epoch(tracker.get(number)["updated_at"])
        delivery = Delivery(f"evt-{index:05d}", source, number, updated)
        self.sent.append(delivery)
        self.todo.put(delivery)
        return delivery

    def _post(self, client: httpx.Client, delivery: Delivery) -> int | str:
        body = json.dumps(
            {"type": "issue.updated", "data": {"number": delivery.number}}, sort_keys=True
        )
        now = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": delivery.delivery_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self.signer.sign(delivery.delivery_id, now, body),
        }
        url = f"{self.d.receiver_url}/hooks/{delivery.source}"
        try:
            return client.post(url, content=body.encode(), headers=headers).status_code
        except httpx.HTTPError as error:
            return type(error).__name__

    def _send_loop(self) -> None:
        # Every socket of this thread is made on the api host.
        with self.d.api.entered(), httpx.Client(timeout=10) as client:
            while (delivery := self.todo.get()) is not None:
                delivery.first_post = time.time()
                wait = 0.5
                while True:
                    answer = self._post(client, delivery)
                    delivery.answers.append(answer)
                    if isinstance(answer, int) and 200 <= answer < 300:
                        delivery.acked = time.time()
                        break
                    if time.time() - delivery.first_post > GIVE_UP_S:
                        break
                    time.sleep(wait)
                    wait = min(5.0, wait * 2)

    def finish(self) -> None:
        for _ in self.threads:
            self.todo.put(None)
        for thread in self.threads:
            thread.join()


def kill_and_restart(d: Deployment, down: float, log: list[dict]) -> None:
    """SIGKILL the receiver, start it ``down`` seconds later; record when it listened again."""
    killed = time.time()
    d.kill_receiver()
    time.sleep(down)
    d.start_receiver()
    while not d.receiver_listening():
        if time.time() - killed > RESTART_LIMIT_S:
            log.append({"killed": killed, "listening": float("nan")})
            return  # the report names it; the receiver's log says why
        time.sleep(0.05)
    log.append({"killed": killed, "listening": time.time()})


def notified_at(d: Deployment) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(source, issue) -> [(its updated_at in the notification, when the POST arrived)]."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with d.sink.lock:
        posts = list(d.sink.posts)
    for _, body, arrived in posts:
        new = body.get("payload", {}).get("new") or {}
        if body.get("kind") == "update" and new.get("updated_at"):
            key = (body["source"], str(body["object_key"]))
            found.setdefault(key, []).append((epoch(new["updated_at"]), arrived))
    return found


def first_notice(delivery: Delivery, notices: dict) -> float | None:
    """When the first notification about the delivery's issue at its version or later came."""
    times = [
        arrived
        for updated, arrived in notices.get((delivery.source, str(delivery.number)), [])
        if updated >= delivery.updated
    ]
    return min(times, default=None)


def recorded(d: Deployment) -> tuple[dict[tuple[str, str], list[float]], int]:
    """(source, issue) -> the updated_at of each update recorded; and how many updates were
    recorded twice (one issue, one content hash, two rows)."""
    found: dict[tuple[str, str], list[float]] = {}
    twice = 0
    for name in d.trackers:
        rows = d.query(
            f'SELECT object_key, new_updated_at, new_hash FROM "{name}_changes"'
            " WHERE kind = 'update'"
        )
        for key, updated, _ in rows:
            found.setdefault((name, str(key)), []).append(epoch(updated))
        twice += len(rows) - len({(key, digest) for key, _, digest in rows})
    return found, twice


def storm_held(d: Deployment, delivery: Delivery) -> bool:
    """Whether the change that recorded ``delivery`` waits in a change-storm hold: its sync
    changed more than half of the tracker's rows (sources/base.py's StormGuard), so it is
    not evaluated until ``changewatch release``; by design, not lost."""
    rows = d.query(
        f'SELECT bool_or(held) FROM "{delivery.source}_changes"'
        " WHERE object_key = %s AND kind = 'update' AND new_updated_at >= to_timestamp(%s)"
        " AT TIME ZONE 'UTC'",
        args=(str(delivery.number), delivery.updated),
    )
    return bool(rows[0][0])


def inbox(d: Deployment) -> dict[str, bool]:
    """Delivery id -> consumed, of every delivery in the PostgreSQL inbox."""
    rows = d.query(
        "SELECT delivery_id, consumed_at IS NOT NULL FROM changewatch_webhook_inbox",
        database="dagster",
    )
    return dict(rows)


def run(args: argparse.Namespace) -> dict:
    """One deployment, the deliveries and kills; the figures."""
    rng = random.Random(args.seed)
    with Deployment(
        workers=2, sources=args.sources, issues=args.issues, interval=3600, webhooks=True,
        webserver=False, concurrency=args.concurrency,
    ) as d:  # fmt: skip
        inserts = sum(len(s.tracker) for s in d.trackers.values())
        d.wait(lambda: len(changes(d)) >= inserts, "the first syncs", limit=args.warmup)
        d.wait(lambda: delivered(d), "the first notifications", limit=args.warmup)
        d.start_receiver()
        d.wait(d.receiver_listening, "the receiver listening", limit=args.warmup)
        provider = Provider(d, args.senders)
        kills_at = {round(args.deliveries * (k + 1) / (args.kills + 1)) for k in range(args.kills)}
        downs: list[dict] = []
        killers: list[threading.Thread] = []
        load_before = os.getloadavg()
        start = time.time()
        for i in range(args.deliveries):
            time.sleep(max(0.0, start + i / args.rate - time.time()))
            if i in kills_at:
                killer = threading.Thread(target=kill_and_restart, args=(d, args.down, downs))
                killer.start()
                killers.append(killer)
            provider.event(i, rng)
        sent_in = time.time() - start
        for killer in killers:
            killer.join()
        provider.finish()
        acked = [x for x in provider.sent if x.acked is not None]

        def all_notified() -> bool:
            notices = notified_at(d)
            return all(first_notice(x, notices) is not None for x in acked)

        def all_consumed() -> bool:
            stored = inbox(d)
            return all(stored.get(x.delivery_id, False) for x in acked)

        try:
            d.wait(all_notified, "every acknowledged delivery's notification", limit=args.drain)
            # A delivery stored after the sync that recorded its change had begun is consumed
            # by the source's next run, which can come after every notification has.
            d.wait(all_consumed, "every acknowledged delivery consumed", limit=args.drain)
        except AssertionError as error:
            print(f"not every delivery notified and consumed: {str(error).splitlines()[0]}",
                  flush=True)  # fmt: skip
        load_after = os.getloadavg()
        notices = notified_at(d)
        unmatched = [x for x in acked if first_notice(x, notices) is None]
        held = sum(1 for x in unmatched if storm_held(d, x))
        changed, twice = recorded(d)
        stored = inbox(d)
        with d.sink.lock:
            ids = Counter(body["notification_id"] for _, body, _ in d.sink.posts)
        latencies, near_kill, while_up = [], [], []
        for x in acked:
            seen = first_notice(x, notices)
            if seen is None:
                continue
            latencies.append(seen - x.first_post)
            if any(0 <= x.first_post - k["killed"] <= NEAR_KILL_S for k in downs):
                near_kill.append(seen - x.first_post)
            if len(x.answers) == 1:  # acknowledged at the first POST: the receiver was up
                while_up.append(seen - x.first_post)
        by_trigger = Counter(
            (f"{r['changewatch/trigger'] or '-'} ({r['job']})", r["status"])
            for r in runs_with_triggers(d)
        )
        return {
            "deliveries": len(provider.sent),
            "sent_in": sent_in,
            "acked": len(acked),
            "not_acked": len(provider.sent) - len(acked),
            "duplicate_answers": sum(1 for x in provider.sent if 200 in x.answers),
            "retried": sum(1 for x in provider.sent if len(x.answers) > 1),
            "not_in_inbox": sum(1 for x in acked if x.delivery_id not in stored),
            "not_consumed": sum(1 for x in acked if not stored.get(x.delivery_id, False)),
            "not_recorded": sum(
                1
                for x in acked
                if not any(u >= x.updated for u in changed.get((x.source, str(x.number)), []))
            ),
            "recorded_twice": twice,
            "notified": len(latencies),
            "storm_held": held,
            "reposted": sum(n - 1 for n in ids.values()),
            "p50": pct(latencies, 0.5),
            "p95": pct(latencies, 0.95),
            "max": max(latencies, default=float("nan")),
            "near_kill": near_kill,
            "while_up": while_up,
            "downs": [k["listening"] - k["killed"] for k in downs],
            "runs": by_trigger,
            "load": (load_before, load_after),
        }


def runs_with_triggers(d: Deployment) -> list[dict]:
    """Every run's job, status and changewatch/trigger tag, from Dagster's storage."""
    rows = d.query(
        "SELECT r.pipeline_name, r.status, t.value FROM runs r LEFT JOIN run_tags t"
        " ON t.run_id = r.run_id AND t.key = 'changewatch/trigger'",
        database="dagster",
    )
    return [
        {"job": job, "status": status, "changewatch/trigger": trigger}
        for job, status, trigger in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=5.0, help="deliveries a second")
    parser.add_argument("--kills", type=int, default=2, help="receiver kills, evenly spaced")
    parser.add_argument("--down", type=float, default=2.0, help="seconds before the restart")
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--issues", type=int, default=100, help="issues per demo tracker")
    parser.add_argument("--concurrency", type=int, default=1, help="runs at once per worker")
    parser.add_argument("--senders", type=int, default=16, help="the provider's threads")
    parser.add_argument("--warmup", type=float, default=900, help="limit of the first syncs, s")
    parser.add_argument("--drain", type=float, default=600, help="limit after the last, s")
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    # Killed (a CI timeout, Ctrl-C): leave through the deployment's exit, which removes the
    # namespaces and every process in them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    f = run(args)
    (l1, l5, _), (a1, a5, _) = f["load"]
    print(
        f"webhooks on several hosts: {f['deliveries']} deliveries to {args.sources} sources in "
        f"{f['sent_in']:.0f} s ({args.rate:g}/s), receiver killed {args.kills}x; load average "
        f"{l1:.2f} {l5:.2f} before, {a1:.2f} {a5:.2f} after"
    )
    print(
        f"acknowledged {f['acked']}, not acknowledged {f['not_acked']}; retried by the provider "
        f"{f['retried']}, answered as duplicates {f['duplicate_answers']}"
    )
    print(
        f"acknowledged but not in the inbox {f['not_in_inbox']}, not consumed "
        f"{f['not_consumed']}, change not recorded {f['not_recorded']}"
    )
    print(
        f"changes recorded twice {f['recorded_twice']}; notifications posted again under "
        f"their id {f['reposted']}"
    )
    near, up = f["near_kill"], f["while_up"]
    print(
        f"POST -> notification, {f['notified']} of {f['acked']} notified: p50 {f['p50']:.1f} s, "
        f"p95 {f['p95']:.1f} s, max {f['max']:.1f} s; within {NEAR_KILL_S:g} s after a kill "
        f"({len(near)}): p50 {pct(near, 0.5):.1f} s, p95 {pct(near, 0.95):.1f} s; acknowledged "
        f"at the first POST ({len(up)}): p50 {pct(up, 0.5):.1f} s, p95 {pct(up, 0.95):.1f} s"
    )
    print(
        f"never notified {f['acked'] - f['notified']}, of which their change waits in a "
        f"change-storm hold {f['storm_held']}"
    )
    print("receiver down (kill -> listening again): " + ", ".join(f"{s:.1f} s" for s in f["downs"]))
    print("runs: " + ", ".join(f"{t} {s} {n}" for (t, s), n in sorted(f["runs"].items())))
    lost = f["not_in_inbox"] + f["not_recorded"] + f["acked"] - f["notified"] - f["storm_held"]
    for ok, text in (
        (lost == 0, f"{lost} acknowledged deliveries lost (inbox, change or notification)"),
        (f["p95"] <= TARGET_P95_S, f"p95 POST -> notification {f['p95']:.1f} s (<= 10 s)"),
    ):
        print(f"{'TARGET MET' if ok else 'TARGET MISSED'}: {text}")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
