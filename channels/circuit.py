"""Per-channel circuits: a channel that keeps failing is paused, probed, and resumed by itself.

Sits inside a delivery pass (``outbox.deliver_due``), between the due deliveries and the
sends. Each channel's circuit lives in the ``channel_circuits`` table, written with the send
that changed it:

* open: sends go. ``pause_after`` temporary failures in a row (``RetryConfig``) pause it.
* paused: no send, no worker time, until ``probe_at``; then one delivery (the channel's
  oldest) is sent as a probe. Delivered: open again, and every retry that waited for the
  channel is due at once. Failed: the next probe waits the schedule's next delay.
* disabled: the receiver answered 410 Gone. Nothing is sent until a person runs
  ``changewatch resume --channel NAME`` (``resume_channel``).

Permanent failures of one message (a 400) dead-letter that message and leave the circuit alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from changewatch.channels.base import DeliveryError
from changewatch.channels.config import RetryConfig
from changewatch.channels.retry import wait
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["Circuit", "count_waiting", "load_circuits", "resume_channel", "save_circuit"]


@dataclass(frozen=True)
class Circuit:
    """One channel's circuit: ``open``, ``paused`` (until ``probe_at``) or ``disabled``."""

    channel: str
    state: str = "open"
    # Temporary failures in a row (reset by a delivery).
    failures: int = 0
    # Probes that failed since the channel was paused: they pick the next probe's wait.
    probes: int = 0
    probe_at: datetime | None = None
    last_error: str | None = None
    changed_at: datetime | None = None

    def admits(self, now: datetime) -> str:
        """``all`` (open), ``probe`` (paused, a probe is due) or ``none``."""
        if self.state == "open":
            return "all"
        if self.state == "paused" and self.probe_at is not None and self.probe_at <= now:
            return "probe"
        return "none"

    def after(
        self,
        outcome: Exception | None,
        retry: RetryConfig,
        now: datetime,
        rng: random.Random | None = None,
    ) -> Circuit:
        """The circuit once a send (a probe, when paused) ended with ``outcome``."""
        if outcome is None:
            if self.state == "open" and self.failures == 0:
                return self
            return Circuit(self.channel, changed_at=now)
        error = (str(outcome) if isinstance(outcome, DeliveryError) else repr(outcome))[:1000]
        if isinstance(outcome, DeliveryError) and outcome.disables:
            return Circuit(
                self.channel, "disabled", self.failures + 1, last_error=error, changed_at=now
            )
        if isinstance(outcome, DeliveryError) and not outcome.retryable:
            return self  # this message's fault (a 400): the next one may well go
        failures = self.failures + 1
        retry_after = outcome.retry_after if isinstance(outcome, DeliveryError) else None
        if self.state == "paused":
            probes = self.probes + 1
        elif failures >= retry.pause_after:
            probes = 0
        else:
            return replace(
                self, failures=failures, last_error=error, changed_at=self.changed_at or now
            )
        pause = wait(retry, probes + 1, retry_after=retry_after, rng=rng)
        return Circuit(
            self.channel,
            "paused",
            failures,
            probes,
            now + timedelta(seconds=pause),
            error,
            now if self.state != "paused" else self.changed_at,
        )

    def line(self) -> str:
        """One line saying what the circuit is and why."""
        if self.state == "open":
            return f"channel {self.channel}: open"
        if self.state == "paused":
            when = self.probe_at.isoformat(timespec="seconds") if self.probe_at else "?"
            return (
                f"channel {self.channel}: paused after {self.failures} failed send(s) in a row, "
                f"next probe at {when}; last error: {self.last_error}"
            )
        return (
            f"channel {self.channel}: disabled, the receiver answered {self.last_error}; "
            f"fix or replace the endpoint, then `changewatch resume --channel {self.channel}`"
        )


def load_circuits(wh: Warehouse) -> dict[str, Circuit]:
    """Every channel's circuit on record (a channel without one is open)."""
    rows = wh.fetch(render("select_channel_circuits", wh.dialect))
    return {row[0]: Circuit(*row) for row in rows}


def save_circuit(wh: Warehouse, circuit: Circuit, *, reopened: bool = False) -> None:
    """Record ``circuit`` (in the caller's transaction). ``reopened``: the channel answers
    again, so the retries waiting for it are due now."""
    c = circuit
    wh.execute(
        render("upsert_channel_circuits", wh.dialect),
        (c.channel, c.state, c.failures, c.probes, c.probe_at, c.last_error, c.changed_at),
    )
    if reopened:
        wh.execute(render("update_deliveries_due_channel", wh.dialect), (c.channel, c.changed_at))


def resume_channel(wh: Warehouse, channel: str, now: datetime) -> Circuit | None:
    """Open ``channel``'s circuit and make its waiting deliveries due; the circuit it had,
    None when it was open."""
    with wh.transaction():
        was = load_circuits(wh).get(channel)
        if was is None or was.state == "open":
            return None
        save_circuit(wh, Circuit(channel, changed_at=now), reopened=True)
    return was


def count_waiting(wh: Warehouse, channel: str) -> int:
    """Deliveries still to make on ``channel``."""
    [(count,)] = wh.fetch(render("count_deliveries_pending", wh.dialect), (channel,))
    return int(count)
