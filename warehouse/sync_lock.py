"""One sync of a source at a time: a sync that finds another one running skips, it does not fail.

Schedulers start syncs on their own clocks (a sensor, cron, `changewatch sync` by hand), so two
of one source meeting is expected, not an error: the one that comes second holds the source's
lock for nothing and would only be dropped at commit (``SyncConflict``). It is told at once,
before it records an attempt or fetches a page, and exits 0.

On PostgreSQL the lock is a session advisory lock, taken without waiting and held across the
sync's transactions; a connection that dies gives it back. DuckDB allows one writing process
per file, so holding the file is the lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress

from changewatch.warehouse.backends import Warehouse

__all__ = ["SyncSkipped", "sync_lock", "sync_lock_key"]


class SyncSkipped(Exception):
    """This sync did nothing, and that is fine: another sync of the source ran instead.

    The message is the line a user sees (``skipped: another sync of <source> is running``).
    """


def sync_lock_key(source: str) -> str:
    """The lock of ``source``'s syncs (also taken, per transaction, by the commit).

    >>> sync_lock_key("demo_issues")
    'changewatch:sync:demo_issues'
    """
    return f"changewatch:sync:{source}"


@contextmanager
def sync_lock(wh: Warehouse, source: str) -> Iterator[None]:
    """Hold ``source``'s sync lock on ``wh`` for the block; raise ``SyncSkipped`` at once if
    another connection holds it."""
    key = sync_lock_key(source)
    if not wh.try_hold(key):
        raise SyncSkipped(f"skipped: another sync of {source} is running")
    try:
        yield
    finally:
        # After a failure the connection may be gone, and its lock with it: the sync's own
        # error is the one to report.
        with suppress(Exception):
            wh.release(key)
