"""A delivery pass in its own process, for tests that kill it with SIGKILL mid-delivery.

Usage: python delivery_driver.py WAREHOUSE_URL CHANNELS_JSON LEASE_SECONDS [BATCH_SIZE]

Runs ``deliver_due`` once against the warehouse with the given channels (a JSON list of
channel settings, as in the watches file) and claim lease, then prints the CLI's summary line.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from changewatch.channels.config import ChannelConfig
from changewatch.channels.outbox import DeliveryPolicy, deliver_due
from changewatch.pipeline.cli.command_line import summarize
from changewatch.warehouse import connect
from pydantic import TypeAdapter


def main(argv: list[str]) -> int:
    url, channels_json, lease = argv[:3]
    # The channels' own settings models, without the whole watches file (and Dagster).
    channels = TypeAdapter(list[ChannelConfig]).validate_json(channels_json)
    policy = DeliveryPolicy(lease=timedelta(seconds=float(lease)))
    if len(argv) > 3:
        policy = DeliveryPolicy(lease=policy.lease, batch_size=int(argv[3]))
    with connect(url) as wh:
        stats = deliver_due(wh, channels, policy=policy)
    print(summarize("notifications", stats.metadata()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
