"""changewatch on several hosts (network namespaces, tests/hosts/deployment.py): what a second
worker host buys, and what a worker host killed mid-run costs.

1. Scaling: the same sources, a fraction of them changing each minute, on 1 worker host and
   then on 2, each worker pinned to a core of its own (taskset) and, with ``--cpu-quota``,
   held to that many cores' time by a cgroup (tests/hosts/cpu_quota.py), so that the workers
   are the bottleneck and the other hosts keep CPU for themselves: with more syncs asked than
   one worker can do, syncs per minute is the workers' capacity. Sources' slots are spread
   over their interval (``--jitter``), so due sources make several runs a minute for the
   workers to share; ``--concurrency`` runs at once on each worker host (Celery's
   ``--concurrency``: a second run fills the gap between one run's end and the next one's
   start). Prints syncs per minute, change -> webhook notification p50/p95 (the demo
   tracker's change to the POST's arrival), the workers' CPU and how often their quota ran
   out, and the control and db hosts' CPU (core-seconds per minute of the window), apart;
   and the load average around each.
2. Kills: a worker host killed (every process, SIGKILL) while a run syncs on it, ``--kills``
   times, restarted after each: lost changes and notifications, duplicates, and the time from
   the kill to the run failed by run monitoring and to its retry done on the other worker.

Root only. The full run by hand (minutes): ``sudo .venv/bin/python bench/bench_hosts.py``;
tests/hosts/test_bench_hosts.py runs a small one.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "hosts"), str(REPO / "tests")]

from deployment import (  # noqa: E402  (the harness lives with the tests)
    PARENT,
    Deployment,
    changes,
    delivered,
    mutate,
    placed,
    runs,
    started_syncing,
    will_retry,
)
from patience import cpu_seconds  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank.

    >>> pct([1.0, 2.0, 3.0, 4.0], 0.5)
    2.0
    """
    ordered = sorted(values)
    return ordered[max(0, round(q * len(ordered) + 0.5) - 1)] if ordered else float("nan")


def synced(d: Deployment) -> int:
    """How many sources have synced at least once."""
    [(exists,)] = d.query("SELECT to_regclass('cw.sync_runs') IS NOT NULL")
    if not exists:
        return 0
    [(count,)] = d.query("SELECT count(DISTINCT source) FROM sync_runs WHERE status = 'succeeded'")
    return count


def scaling(workers: int, args: argparse.Namespace) -> dict:
    """One deployment with ``workers`` pinned worker hosts: its figures over the window."""
    with Deployment(
        workers=workers, sources=args.sources, issues=args.issues, interval=args.interval,
        pin=True, concurrency=args.concurrency, cpu_quota=args.cpu_quota, jitter=args.jitter,
        webserver=False,
    ) as d:  # fmt: skip
        # One query, not one per source's table: at hundreds of sources the bench's own polling
        # of every changes table was most of the db host's work during the warm-up.
        d.wait(lambda: synced(d) >= len(d.trackers), "the first syncs", limit=args.warmup)
        d.wait(lambda: delivered(d), "the first notifications", limit=args.warmup)
        load_before = os.getloadavg()
        names = list(d.trackers)
        per_second = args.change * len(names) / 60
        made: dict[tuple[str, str], float] = {}
        measured = (d.control, d.db, *d.workers)
        cpu0 = {h.name: cpu_seconds(h.pids()) for h in measured}
        quota0 = {name: quota.stat() for name, quota in d.quotas.items()}
        start = time.time()
        owed = 0.0
        while (now := time.time()) < start + args.minutes * 60:
            owed += per_second
            while owed >= 1:
                owed -= 1
                name = random.choice(names)
                for key in d.trackers[name].tracker.mutate(update=1)["updated"]:
                    made[(name, str(key))] = time.time()
            time.sleep(max(0.0, 1 - (time.time() - now)))
        end = time.time()
        cpu = {h.name: cpu_seconds(h.pids()) - cpu0[h.name] for h in measured}
        throttled = [quota.throttled(quota0[name]) for name, quota in d.quotas.items()]
        load_after = os.getloadavg()
        [(syncs,)] = d.query(
            "SELECT count(*) FROM sync_runs WHERE status = 'succeeded'"
            " AND finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
            args=(start, end),
        )
        # The changes made near the end get their notifications after it: wait for them.
        drain = time.time() + 3 * args.interval + 60

        def latencies() -> list[float]:
            first: dict[tuple[str, str], float] = {}
            with d.sink.lock:
                for _, body, arrived in d.sink.posts:
                    key = (body["source"], str(body["object_key"]))
                    if key in made and arrived > made[key]:
                        first[key] = min(first.get(key, arrived), arrived)
            return [first[k] - made[k] for k in first]

        while len(latencies()) < len(made) and time.time() < drain:
            time.sleep(1)
        waits = latencies()
        minutes = (end - start) / 60
        return {
            "workers": workers,
            "syncs_per_min": syncs / minutes,
            "changes": len(made),
            "notified": len(waits),
            "p50": pct(waits, 0.5),
            "p95": pct(waits, 0.95),
            "control_cpu": cpu["control"] / minutes,
            "db_cpu": cpu["db"] / minutes,
            "worker_cpu": sum(cpu[w.name] for w in d.workers) / minutes / workers,
            "throttled": sum(throttled) / len(throttled) if throttled else float("nan"),
            "load": (load_before[0], load_after[0]),
        }


def kill_once(d: Deployment, expected: Counter) -> tuple[float, float]:
    """Change every source, kill the worker host a run syncs on, start it again; seconds
    from the kill to its run failed, and to that run's retry done. Adds to ``expected``.

    The host is whichever one the run landed on: Celery hands runs to whichever worker asks
    first, and with runs this short one worker can take them all for minutes."""
    mutate(d, expected, create=1, update=2, delete=1)
    mutated = time.time()

    hosts = {worker.name: worker for worker in d.workers}

    def victim() -> tuple[str, object] | None:
        run_id = started_syncing(d, mutated)
        task = runs(d).get(run_id or "", {}).get("dagster-celery/task_id")
        name = placed(d).get(task)
        return (run_id, hosts[name]) if run_id and name in hosts else None

    d.wait(lambda: victim() is not None, "a run syncing on a worker host")
    found = victim()
    if found is None:  # it ended between the two looks: the next round of changes
        return kill_once(d, expected)
    run_id, host = found
    host.kill_all()
    killed = time.time()
    d.wait(lambda: runs(d)[run_id]["status"] in ("FAILURE", "SUCCESS"), "run monitoring")
    if runs(d)[run_id]["status"] == "SUCCESS" or not will_retry(d, run_id):
        # It ended between the look and the kill (a run of a few sources takes about a
        # second), or its one step had (Dagster then has no step to retry: "No steps needed
        # to be retried"): nothing was cut mid-work. The host comes back; the next round.
        d.start_worker(host, concurrency=1)
        return kill_once(d, expected)
    failed = time.time() - killed

    def retried() -> bool:
        return any(r.get(PARENT) == run_id and r["status"] == "SUCCESS" for r in runs(d).values())

    d.wait(retried, "the retry")
    done_after = time.time() - killed
    d.start_worker(host, concurrency=1)  # the host comes back for the next round
    return failed, done_after


def kills(args: argparse.Namespace) -> dict:
    """Kill a worker host mid-run ``args.kills`` times; what was lost, doubled, and how fast."""
    with Deployment(workers=2, sources=args.kill_sources, issues=args.issues, interval=10) as d:
        expected: Counter = Counter()
        for name, server in d.trackers.items():
            expected.update((name, "insert", i["number"]) for i in server.tracker.snapshot())
        d.wait(lambda: set(changes(d)) >= set(expected), "the first syncs", limit=args.warmup)
        failed_after, retried_after = [], []
        for round_ in range(args.kills):
            failed, retried = kill_once(d, expected)
            failed_after.append(failed)
            retried_after.append(retried)
            print(f"kill {round_ + 1}: failed {failed:.1f} s, retried and done {retried:.1f} s",
                  flush=True)  # fmt: skip
        d.wait(
            lambda: changes(d) >= expected and delivered(d),
            "every change delivered",
            limit=args.warmup,
        )
        found = changes(d)
        ids = {row[0] for row in d.query("SELECT notification_id FROM outbox")}
        with d.sink.lock:
            posts = list(d.sink.posts)
        posted = {body["notification_id"] for _, body, _ in posts}
        mixed = sum(1 for hook, body, _ in posts if hook != body["notification_id"])
        return {
            "kills": args.kills,
            "lost_changes": sum((expected - found).values()),
            "doubled_changes": sum((found - expected).values()),
            "lost_notifications": len(ids - posted),
            "repeated_posts": len(posts) - len(posted),
            "posts_under_another_webhook_id": mixed,
            "failed_p50": pct(failed_after, 0.5),
            "failed_max": max(failed_after),
            "retried_p50": pct(retried_after, 0.5),
            "retried_max": max(retried_after),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=2000)
    parser.add_argument("--issues", type=int, default=5, help="issues per demo tracker")
    parser.add_argument("--interval", type=float, default=60, help="each source's interval, s")
    parser.add_argument("--change", type=float, default=0.05, help="sources changing a minute")
    parser.add_argument("--minutes", type=float, default=5, help="the measured window")
    parser.add_argument("--warmup", type=float, default=1800, help="limit of the first syncs, s")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--kill-sources", type=int, default=8)
    parser.add_argument(
        "--cpu-quota", type=float, default=None, help="cores of CPU time per worker host"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1,
        help="runs at once per worker host (Celery's --concurrency) in the scaling part",
    )  # fmt: skip
    parser.add_argument(
        "--jitter", type=float, default=None, help="spread of slots, s (default: 0.9 interval)"
    )
    args = parser.parse_args()
    if args.jitter is None:
        args.jitter = 0.9 * args.interval  # below the interval, as the watches file wants
    # Killed (a CI timeout, Ctrl-C): leave through the deployments' exits, which remove the
    # namespaces, the cgroups and every process in them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    quota = f"{args.cpu_quota:g} core" if args.cpu_quota else "no quota"
    print(f"scaling: {args.sources} sources, interval {args.interval:g} s (asked: "
          f"{args.sources * 60 / args.interval:.0f} syncs/min), {args.change:.0%} changing a "
          f"minute, {args.minutes:g} min window; each worker on its own CPU, {quota}, "
          f"{args.concurrency} run(s) at once",
          flush=True)  # fmt: skip
    results = [scaling(workers, args) for workers in (1, 2)]
    print("workers  syncs/min  changes  notified  p50 s  p95 s  control core-s/min  db core-s/min"
          "  worker core-s/min  quota ran out  load before/after")  # fmt: skip
    for r in results:
        print(f"{r['workers']:>7}  {r['syncs_per_min']:>9.1f}  {r['changes']:>7}  "
              f"{r['notified']:>8}  {r['p50']:>5.1f}  {r['p95']:>5.1f}  "
              f"{r['control_cpu']:>18.2f}  {r['db_cpu']:>13.2f}  {r['worker_cpu']:>17.2f}  "
              f"{r['throttled']:>13.0%}  {r['load'][0]:>6.1f} {r['load'][1]:.1f}")  # fmt: skip
    ratio = results[1]["syncs_per_min"] / max(results[0]["syncs_per_min"], 1e-9)
    print(f"2 workers / 1 worker: {ratio:.2f}x the syncs per minute")
    if args.kills:
        k = kills(args)
        print(
            f"kills: {k['kills']}; lost changes {k['lost_changes']}, doubled changes "
            f"{k['doubled_changes']}, lost notifications {k['lost_notifications']}, repeated "
            f"posts {k['repeated_posts']} (under another webhook-id: "
            f"{k['posts_under_another_webhook_id']}); run failed after p50 "
            f"{k['failed_p50']:.1f} s (max {k['failed_max']:.1f}), retried and done after p50 "
            f"{k['retried_p50']:.1f} s (max {k['retried_max']:.1f})"
        )


if __name__ == "__main__":
    main()
