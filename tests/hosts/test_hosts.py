"""changewatch on several hosts: runs placed on worker hosts by Dagster (dagster-celery), a
worker host lost mid-run, the db host's PostgreSQL restarted, a worker host lost mid-send of an
e-mail (tests/hosts/deployment.py).

Root only (network namespaces): `pytest -m hosts tests/hosts -n 0`, as .ci/run does. The tests
share one deployment and run in order: the second kills a worker host, the last starts it again.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from changewatch.channels.recovery import PARKED
from deployment import (
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

pytestmark = pytest.mark.hosts

# Tries at killing worker1 while one of its runs syncs (a run may end before the kill lands).
ATTEMPTS = 5

# What PostgreSQL and its clients say of a connection a fast shutdown ended.
CUT = re.compile(
    r"terminating connection|server closed the connection|connection refused"
    r"|no connection to the server",
    re.I,
)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with Deployment(workers=2, sources=4, email=True) as deployed:
        yield deployed


def first_sync(d: Deployment) -> Counter:
    return Counter(
        (name, "insert", issue["number"])
        for name, server in d.trackers.items()
        for issue in server.tracker.snapshot()
    )


def check_once_and_delivered(d: Deployment, expected: Counter) -> None:
    """Every expected change recorded once (a key changed twice: twice); every notification
    posted, under one webhook-id (the e-mail watch's are the last test's)."""
    found = changes(d)
    assert found == expected, (found - expected, expected - found)
    hooked = "SELECT {} FROM outbox WHERE starts_with(watch, 'every_change_')"
    [(outbox, keys)] = d.query(hooked.format("count(*), count(DISTINCT dedupe_key)"))
    assert outbox == keys == found.total()
    ids = {row[0] for row in d.query(hooked.format("notification_id"))}
    with d.sink.lock:
        posts = list(d.sink.posts)
    by_id: dict[str, set[str]] = {}
    for webhook_id, body, _ in posts:
        by_id.setdefault(body["notification_id"], set()).add(webhook_id)
    assert set(by_id) == ids  # at least once each, nothing else
    # A repeat (a send cut short by the lost host) carries the same webhook-id.
    assert all(hooks == {nid} for nid, hooks in by_id.items())


def test_runs_are_placed_on_both_worker_hosts(deployment):
    d = deployment
    want = first_sync(d)
    d.wait(
        lambda: changes(d) >= want,
        "every source's first sync",
        progress=lambda: len(changes(d)),
    )
    # Runs keep coming (a sync every 10 s): with one run at a time per worker, both get some.
    d.wait(
        lambda: (
            {
                placed(d).get(r.get("dagster-celery/task_id"))
                for r in runs(d).values()
                if r["status"] == "SUCCESS"
            }
            >= {"worker1", "worker2"}
        ),
        "successful runs on both worker hosts",
        progress=lambda: len(runs(d)),
    )
    d.wait(lambda: delivered(d), "the first notifications")
    check_once_and_delivered(d, want)
    # Every finished run went through Celery and was taken by a worker host; the control host
    # runs no run (its processes: Redis, the daemon, the webserver, their code servers).
    where = placed(d)
    done = [r for r in runs(d).values() if r["status"] == "SUCCESS"]
    assert all(where.get(r.get("dagster-celery/task_id")) in ("worker1", "worker2") for r in done)
    # A step's materialization event, logged where the step ran (a batched run no longer logs
    # a summary line per sync: its counts are the materialization's metadata).
    materialized = re.compile(r" - ASSET_MATERIALIZATION - ")
    assert any(materialized.search(d.log(w.name)) for w in d.workers)
    assert not any(materialized.search(d.log(name)) for name in ("daemon", "webserver"))


def test_a_worker_host_lost_mid_run_is_retried_on_the_other(deployment):
    d = deployment
    expected = changes(d)
    mutate(d, expected, create=2, update=3, delete=1)
    mutated = time.time()

    def victim() -> str | None:
        """A run started on worker1 after the mutation, with a sync under way."""
        where = placed(d)
        for run_id, run in runs(d).items():
            if run["status"] == "STARTED" and where.get(run.get("dagster-celery/task_id")) == (
                "worker1"
            ):
                syncing = d.query(
                    "SELECT count(*) FROM sync_runs WHERE dagster_run_id = %s"
                    " AND started_at > to_timestamp(%s)",
                    args=(run_id, mutated),
                )
                if syncing[0][0]:
                    return run_id
        return None

    # A run of a few sources takes about a second: it may end between the look and the kill.
    # Then nothing was cut mid-run: worker1 comes back, the sources change again, another try.
    for _ in range(ATTEMPTS):
        d.wait(lambda: victim() is not None, "a run syncing on worker1")
        killed_run = victim() or ""
        assert d.workers[0].kill_all() > 0
        killed = time.time()
        d.wait(
            lambda run=killed_run: runs(d)[run]["status"] in ("FAILURE", "SUCCESS"),
            "run monitoring failing the run",
        )
        if runs(d)[killed_run]["status"] == "FAILURE" and will_retry(d, killed_run):
            break
        # It ended before the kill, or its one step had (Dagster has no step to retry).
        d.start_worker(d.workers[0], concurrency=1)
        mutate(d, expected, update=1)
        mutated = time.time()
    else:
        pytest.fail(f"no run of worker1's was cut mid-run in {ATTEMPTS} tries")
    failed_after = time.time() - killed

    def retry() -> dict | None:
        return next((r for r in runs(d).values() if r.get(PARENT) == killed_run), None)

    d.wait(lambda: (retry() or {}).get("status") == "SUCCESS", "the retry, on worker2")
    retried_after = time.time() - killed
    assert placed(d)[retry()["dagster-celery/task_id"]] == "worker2"
    print(f"run failed {failed_after:.1f} s after the kill, retried and done {retried_after:.1f} s")

    d.wait(
        lambda: changes(d) >= expected and delivered(d),
        "every change delivered",
        progress=lambda: len(changes(d)),
    )
    check_once_and_delivered(d, expected)
    # The killed run's syncs are not left 'running' (the retry marked them abandoned), and the
    # lost host holds no session, so no sync lock, on the db host.
    stuck = d.query(
        "SELECT count(*) FROM sync_runs WHERE status = 'running' AND dagster_run_id = %s",
        args=(killed_run,),
    )
    assert stuck == [(0,)]
    sessions = d.query(
        "SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s",
        database="dagster",
        args=(d.workers[0].address,),
    )
    assert sessions == [(0,)]


def failure_lines(d: Deployment, run_id: str) -> list[str]:
    """The first line of each failed step's deepest error: what a user reads first."""
    lines = []
    for (event,) in d.query(
        "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'STEP_FAILURE'",
        database="dagster",
        args=(run_id,),
    ):
        error = json.loads(event)["dagster_event"]["event_specific_data"]["error"]
        while error.get("cause"):
            error = error["cause"]
        lines.append(error["message"].strip().splitlines()[0])
    return lines


def test_the_db_host_restarted_fails_runs_in_one_line_and_the_next_succeed(deployment):
    d = deployment
    expected = changes(d)
    mutate(d, expected, create=1, update=2, delete=1)
    mutated = time.time()
    # A run of a few sources takes about a second: it may end between the look and the stop,
    # or have only Dagster's own writes left, which wait for the database and go through.
    # Then nothing was cut mid-sync: the sources change again, another try.
    for _ in range(ATTEMPTS):
        d.wait(lambda since=mutated: started_syncing(d, since) is not None, "a run syncing")
        cut_run = started_syncing(d, mutated) or ""
        before = set(runs(d))
        d.pg_ctl("stop")
        time.sleep(10)
        d.pg_ctl("start")
        restarted = time.time()
        d.wait(
            lambda run=cut_run: runs(d)[run]["status"] in ("FAILURE", "SUCCESS"),
            "the cut run's end",
        )
        if runs(d)[cut_run]["status"] == "FAILURE":
            break
        mutate(d, expected, update=1)
        mutated = time.time()
    else:
        pytest.fail(f"no run was cut mid-sync by the restart in {ATTEMPTS} tries")
    # Each failed step says why in its error's first line: the connection the restart cut.
    lines = failure_lines(d, cut_run)
    print("\n".join(lines))
    assert lines, d.query(  # no step failure recorded: what the run's log holds instead
        "SELECT dagster_event_type, left(event, 600) FROM event_logs WHERE run_id = %s"
        " AND dagster_event_type IS NOT NULL ORDER BY id",
        database="dagster",
        args=(cut_run,),
    )
    assert all(CUT.search(line) for line in lines), lines
    d.wait(
        lambda: any(r["status"] == "SUCCESS" for k, r in runs(d).items() if k not in before),
        "a run after the restart succeeding",
    )
    print(f"a run succeeded {time.time() - restarted:.1f} s after the restart")
    d.wait(
        lambda: changes(d) >= expected and delivered(d),
        "every change delivered",
        progress=lambda: len(changes(d)),
    )
    check_once_and_delivered(d, expected)


def test_an_email_cut_short_by_a_lost_worker_host_is_never_sent_twice(deployment):
    """E-mail's guarantee across hosts: at most once per dedupe key. A send cut short by a lost
    host is never repeated; if the server had not accepted it, it is lost, and the outbox says
    so (the delivery parked as dead, naming why), for a person to look at."""
    d = deployment
    mail_source = next(iter(d.trackers))
    if d.procs[d.workers[0].name].poll() is not None:  # lost for good in the second test
        d.start_worker(d.workers[0], concurrency=1)
    unsettled = "SELECT 1 FROM deliveries WHERE channel = 'mail' AND status NOT IN ('sent', 'dead')"
    d.wait(lambda: not d.query(unsettled), "the e-mails so far")
    d.mail.hold()
    mutated = time.time()
    updated = d.trackers[mail_source].tracker.mutate(update=3)["updated"]
    d.wait(d.mail.held.is_set, "an e-mail mid-send")
    [host] = [w for w in d.workers if w.address == d.mail.held_peer]
    assert host.kill_all() > 0
    d.mail.release()  # the server refuses it now: the sender is gone, it was never accepted

    def settled() -> bool:
        rows = d.query(
            "SELECT count(*) FROM outbox o JOIN deliveries USING (notification_id)"
            " WHERE o.watch = %s AND o.object_key = ANY(%s) AND status IN ('sent', 'dead')"
            # This round's: an earlier test may have changed the same keys, notified then.
            " AND o.created_at > to_timestamp(%s)",
            args=(f"mail_{mail_source}", [str(n) for n in updated], mutated),
        )
        return rows == [(len(updated),)] and not d.query(unsettled)

    d.wait(settled, "every e-mail sent or parked", progress=lambda: len(d.mail.accepted))
    rows = d.query(
        "SELECT notification_id, status, last_error FROM deliveries WHERE channel = 'mail'"
    )
    accepted = Counter(d.mail.accepted)
    assert max(accepted.values()) == 1  # at most once each
    [(cut, error)] = [(n, e) for n, status, e in rows if status == "dead"]
    assert cut == d.mail.held_id and accepted[cut] == 0  # lost, and said so:
    assert error == PARKED
    assert {n for n, status, _ in rows if status == "sent"} == set(accepted)
