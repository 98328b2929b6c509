"""After a crash: deliveries left 'sending' past the claim lease are sent again or parked.

Sits at the start of each delivery pass (``outbox.deliver_due``). Each send is recorded as it
completes, so a crash leaves 'sending' only what was in flight: one message for channels that
send one at a time, the one write's batch for a file. Whether it arrived is unknown. A channel
whose receiver recognises a repeat (``retry_after_crash``: webhook by `webhook-id`, file by the
notification id on each line) gets it again, at least once; the others (email, apprise,
console) park it as dead, at most once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from changewatch.channels.build import retries_after_crash
from changewatch.channels.config import ChannelConfig
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["PARKED", "REQUEUED", "Recovered", "recover_interrupted"]

# The last_error of a requeued delivery: its next claim knows an earlier send may have arrived.
REQUEUED = "interrupted while sending; sent again: the receiver recognises a repeat"
PARKED = (
    "interrupted while sending (it may have arrived); not sent again: the channel delivers at "
    "most once, or the attempts ran out"
)


@dataclass
class Recovered:
    """What the recovery of interrupted sends did, by channel."""

    requeued: dict[str, int] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)


def recover_interrupted(
    wh: Warehouse,
    channels: Sequence[ChannelConfig],
    *,
    lease: timedelta,
    max_attempts: Mapping[str, int],
    now: datetime,
) -> Recovered:
    """Requeue or park every delivery claimed more than ``lease`` before ``now``, in one txn.

    ``max_attempts`` gives each channel's (its retry schedule's): a send that crashed its
    deliverer on its last attempt is parked, so it cannot crash it forever.
    """
    retry_safe = [c.name for c in channels if retries_after_crash(c)]
    expired = now - lease
    recovered = Recovered()
    requeued: list[tuple[object, ...]] = []
    with wh.transaction():
        # One statement per channel (there are few): each has its own attempt limit.
        for name in retry_safe:
            requeued += wh.fetch(
                render("requeue_deliveries", wh.dialect),
                (expired, now, REQUEUED, [name], max_attempts.get(name, 1)),
            )
        parked = wh.fetch(render("update_deliveries_stale", wh.dialect), (expired, PARKED))
    for rows, counts in ((requeued, recovered.requeued), (parked, recovered.parked)):
        for _, channel in rows:
            counts[channel] = counts.get(channel, 0) + 1
    return recovered
