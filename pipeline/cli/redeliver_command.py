"""`changewatch redeliver`: list, then send again, dead-lettered notifications.

Each goes once, under its original id (a receiver deduplicating by `webhook-id` sees a retry
of the same message, not a new one); see channels/redeliver.py. ``--dry-run`` lists only.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from changewatch.pipeline.project.expected_errors import UsageError

if TYPE_CHECKING:
    from changewatch.pipeline.project.watches_file import ChangewatchConfig

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """The `redeliver` subcommand."""
    redeliver = commands.add_parser(
        "redeliver", help="send dead-lettered notifications again, once each, same ids"
    )
    redeliver.add_argument("--watch", metavar="W", help="only the notifications of watch W")
    redeliver.add_argument("--channel", metavar="C", help="only the deliveries to channel C")
    redeliver.add_argument(
        "--since",
        metavar="AGE",
        help="only those dead-lettered within AGE (e.g. 2d, 6h, 90m; default: all)",
    )
    redeliver.add_argument("--dry-run", action="store_true", help="list them, send nothing")


def run(config: ChangewatchConfig, args: argparse.Namespace, *, now: float | None = None) -> int:
    """List the matching dead letters, then (unless a dry run) send each once; one line each."""
    from changewatch.channels.redeliver import ChannelDisabled, dead_letters, redeliver
    from changewatch.sources.base import parse_duration
    from changewatch.warehouse import connect

    _known("watch", args.watch, [w.name for w in config.watches])
    _known("channel", args.channel, [c.name for c in config.channels])
    since = None
    if args.since is not None:
        try:
            age = parse_duration(args.since)
        except ValueError as bad:
            raise UsageError(f"--since: {bad}") from None
        since = datetime.fromtimestamp((time.time() if now is None else now) - age, UTC)
    with connect() as wh:
        dead = dead_letters(wh, watch=args.watch, channel=args.channel, since=since)
        verb = "would send" if args.dry_run else "sending"
        print(f"{dead.height} dead-lettered deliver{'y' if dead.height == 1 else 'ies'}; {verb}:")
        for row in dead.iter_rows(named=True):
            print(
                f"  {row['notification_id']}  {row['channel']}  {row['watch']}  "
                f"{row['object_key']}  {row['title']!r}  (dead since "
                f"{row['dead_at'].isoformat(timespec='seconds')}: {row['last_error']})"
            )
        if args.dry_run or dead.is_empty():
            return 0
        try:
            done = redeliver(wh, config.channels, dead, feedback=config.feedback)
        except ChannelDisabled as disabled:
            raise UsageError(str(disabled)) from None
    print(f"redelivered {len(done.sent)} of {dead.height}")
    for notification_id, channel, error in done.failed:
        print(f"  {channel}  {notification_id}: failed again, still dead-lettered: {error}")
    return 0 if not done.failed else 1


def _known(kind: str, name: str | None, names: list[str]) -> None:
    if name is not None and name not in names:
        raise UsageError(
            f"no {kind} {name!r} in the watches file (known: {', '.join(names) or 'none'})"
        )
