"""The retry schedule and the per-channel circuit against real loopback receivers, on DuckDB
and Postgres: which answers retry, which end it, pausing, probing, 410 and resume."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from changewatch.channels.circuit import load_circuits, resume_channel
from changewatch.channels.config import RetryConfig, WebhookChannelConfig
from changewatch.channels.outbox import DeliveryPolicy, deliver_due
from changewatch.warehouse import connect
from queued import enqueue

START = datetime(2030, 1, 1, tzinfo=UTC)
EXACT = DeliveryPolicy(retry=RetryConfig(jitter=0))


def hook(receiver: Any, name: str = "hook", **settings: Any) -> WebhookChannelConfig:
    return WebhookChannelConfig(name=name, type="webhook", url=f"{receiver.url}/h", **settings)


def rows(url: str) -> dict[str, tuple[str, int, datetime]]:
    with connect(url) as wh:
        found = wh.fetch(
            "SELECT notification_id, status, attempts, next_attempt_at FROM deliveries"
        )
    return {nid: (status, attempts, at) for nid, status, attempts, at in found}


def test_each_answer_retries_or_ends_as_the_schedule_says(
    warehouse_url: str, http_receiver: Any
) -> None:
    answers = [(429, {"retry-after": "120"}), (409, {}), (408, {}), (403, {}), (503, {})]
    http_receiver.responses = list(answers)
    with connect(warehouse_url) as wh:
        ids = enqueue(wh, ["hook"], [(str(n), n) for n in range(1, 6)], at=START)
        deliver_due(wh, [hook(http_receiver)], policy=EXACT, now=lambda: START)
    got = rows(warehouse_url)
    # 429 waits what Retry-After says, not the schedule's 5 s; 409, 408 and 503 are
    # temporary; 403 is permanent: dead after one attempt.
    assert got[ids[0]] == ("pending", 1, START + timedelta(seconds=120))
    assert [got[i][:2] for i in ids[1:]] == [
        ("pending", 1),
        ("pending", 1),
        ("dead", 1),
        ("pending", 1),
    ]
    assert got[ids[1]][2] == START + timedelta(seconds=5)


def test_the_schedule_comes_from_the_channel_and_ends_in_the_dead_letter(
    warehouse_url: str, http_receiver: Any
) -> None:
    http_receiver.responses = [(500, {})] * 10
    # This channel's own schedule: two waits, so three attempts; it never pauses here.
    channel = hook(http_receiver, retry={"delays": ["1m", "1h"], "jitter": 0, "pause_after": 9})
    clock = [START]
    with connect(warehouse_url) as wh:
        [nid] = enqueue(wh, ["hook"], [("1", 1)], at=START)
        for step in (0, 59, 60, 3659, 3660 + 60, 90_000):
            clock[0] = START + timedelta(seconds=step)
            deliver_due(wh, [channel], policy=EXACT, now=lambda: clock[0])
    assert len(http_receiver.requests) == 3  # at 0 s, 60 s and 3,660 s
    assert rows(warehouse_url)[nid][:2] == ("dead", 3)


def test_a_failing_channel_pauses_probes_and_reopens_in_order(
    warehouse_url: str, http_receiver: Any
) -> None:
    http_receiver.responses = [(503, {})] * 3
    retry = RetryConfig(delays=[60, 600], jitter=0, pause_after=2)
    channels = [hook(http_receiver, retry=retry), hook(http_receiver, "other")]
    clock = [START]

    def deliver(seconds: float) -> Any:
        clock[0] = START + timedelta(seconds=seconds)
        with connect(warehouse_url) as wh:
            return deliver_due(wh, channels, policy=EXACT, now=lambda: clock[0])

    with connect(warehouse_url) as wh:
        ids = enqueue(wh, ["hook"], [(f"k{n % 2}", n) for n in range(1, 7)], at=START)
    first = deliver(0)
    # Two failures in a row pause it: the other four are not tried at all.
    assert len(http_receiver.requests) == 2 and first.retrying == 2
    with connect(warehouse_url) as wh:
        circuit = load_circuits(wh)["hook"]
    assert (circuit.state, circuit.probe_at) == ("paused", START + timedelta(seconds=60))
    assert "503" in (circuit.last_error or "")
    held = deliver(30)
    assert len(http_receiver.requests) == 2 and held.held == {"hook": 6 - 2}
    deliver(61)  # the probe (the oldest notification) fails: next probe 600 s later
    assert len(http_receiver.requests) == 3
    assert http_receiver.requests[-1].headers["webhook-id"] == ids[0]
    deliver(600)
    assert len(http_receiver.requests) == 3
    back = deliver(662)  # the probe gets through: open, and everything waiting goes, in order
    assert back.sent == 6 and len(http_receiver.requests) == 9
    assert [r.headers["webhook-id"] for r in http_receiver.requests[3:]] == ids
    with connect(warehouse_url) as wh:
        assert load_circuits(wh)["hook"].state == "open"


def test_410_disables_the_channel_after_one_attempt_until_resumed(
    warehouse_url: str, http_receiver: Any
) -> None:
    http_receiver.responses = [(410, {})]
    channels = [hook(http_receiver), hook(http_receiver, "other")]
    with connect(warehouse_url) as wh:
        ids = enqueue(wh, ["hook", "other"], [("a", 1), ("b", 2), ("c", 3)], at=START)
        stats = deliver_due(wh, channels, policy=EXACT, now=lambda: START)
        # A day later nothing more went to it; the other channel had all three at once.
        later = deliver_due(wh, channels, policy=EXACT, now=lambda: START + timedelta(days=1))
        circuit = load_circuits(wh)["hook"]
    assert (
        len(http_receiver.requests) == 4
        and stats.by_channel == {"other": 3}
        and later.held == {"hook": 3}
    )
    assert circuit.state == "disabled" and "410" in circuit.line()
    assert "changewatch resume --channel hook" in circuit.line()
    # Nothing of the channel's queue is lost: all three wait, the 410'd one included.
    with connect(warehouse_url) as wh:
        waiting = wh.fetch(
            "SELECT count(*) FROM deliveries WHERE channel = 'hook' AND status = 'pending'"
        )
        assert waiting == [(3,)]
        assert resume_channel(wh, "hook", START + timedelta(days=1)).state == "disabled"
        assert resume_channel(wh, "hook", START + timedelta(days=1)) is None  # already open
        again = deliver_due(wh, channels, policy=EXACT, now=lambda: START + timedelta(days=1))
    assert again.by_channel == {"hook": 3}
    hook_ids = [json.loads(r.body)["notification_id"] for r in http_receiver.requests[4:]]
    assert hook_ids == ids


def test_every_payload_carries_the_order_so_a_late_retry_is_dropped(
    warehouse_url: str, http_receiver: Any
) -> None:
    # v1 of object "a" fails for now; v2 goes through; v1's retry arrives after it.
    http_receiver.responses = [(503, {})]
    with connect(warehouse_url) as wh:
        enqueue(wh, ["hook"], [("a", 1), ("a", 2)], at=START)
        deliver_due(wh, [hook(http_receiver)], policy=EXACT, now=lambda: START)
        later = START + timedelta(minutes=1)
        deliver_due(wh, [hook(http_receiver)], policy=EXACT, now=lambda: later)
    arrived = [json.loads(r.body) for r in http_receiver.requests[1:]]
    assert [p["title"] for p in arrived] == ["a v2", "a v1"]
    # What a receiver does (docs/delivery.md): keep the highest sequence per object.
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for payload in arrived:
        key = (payload["source"], payload["object_key"])
        if key not in newest or payload["sequence"] > newest[key]["sequence"]:
            newest[key] = payload
    assert newest[("src", "a")]["title"] == "a v2"
    assert [p["sequence"] for p in arrived] == [2, 1]
    assert arrived[0]["changed_at"] > arrived[1]["changed_at"]


def test_a_failed_probe_spends_the_channel_not_the_notification(
    warehouse_url: str, http_receiver: Any
) -> None:
    http_receiver.responses = [(503, {})] * 3
    # Three attempts over 3,660 s on its own; paused after one failure, probed on the same waits.
    channel = hook(http_receiver, retry={"delays": [60, 3600], "jitter": 0, "pause_after": 1})
    with connect(warehouse_url) as wh:
        [nid] = enqueue(wh, ["hook"], [("a", 1)], at=START)
    for step in (0, 60, 3660, 7260):
        with connect(warehouse_url) as wh:
            at = START + timedelta(seconds=step)
            deliver_due(wh, [channel], policy=EXACT, now=lambda at=at: at)
        if step == 3660:
            # Its third failure, the schedule's span gone by: dead, were it not a probe.
            assert rows(warehouse_url)[nid][:2] == ("pending", 3)
    assert len(http_receiver.requests) == 4
    assert rows(warehouse_url)[nid][:2] == ("sent", 4)
