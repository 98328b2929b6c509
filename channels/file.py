"""Append each notification as one JSON line to a file."""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from changewatch.channels.base import DeliveryError, Notification

__all__ = ["FileChannel"]

# Errors that no retry fixes: the path itself is wrong or forbidden.
_PERMANENT = {
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.EROFS,
    errno.ENAMETOOLONG,
    errno.ELOOP,
}

# Where a line names its notification (compact JSON); a match is confirmed by parsing the line,
# since a payload may hold the same key.
_ID = re.compile(rb'"notification_id":"([^"\\]*)"')

# One lock per file, shared by every channel writing it in this process.
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    key = os.path.realpath(path)
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


class FileChannel:
    """Appends `notification.to_json()` as one line of JSON (JSON Lines) to `path`.

    A batch of lines goes out in one write on an O_APPEND descriptor, under a per-file lock:
    lines from concurrent senders in one process never interleave, and appends from other
    processes land between whole batches on local filesystems.
    """

    # Each line carries its notification id, and a batch cut short by a crash is first looked
    # up in the file (already_delivered): a retry writes only the lines that are missing.
    retry_after_crash: ClassVar[bool] = True

    def __init__(self, name: str, path: str | os.PathLike[str]):
        self.name = name
        self.path = Path(path).expanduser()

    def already_delivered(self, notifications: Sequence[Notification]) -> set[str]:
        """The ids of `notifications` that have a whole line in the file.

        Reads the whole file: it runs only for a batch whose earlier write was cut short by a
        crash, where the lines written may be anywhere after those of earlier batches.
        """
        wanted = {n.notification_id for n in notifications}
        found: set[str] = set()
        try:
            with _lock_for(self.path), self.path.open("rb") as lines:
                for line in lines:
                    # A cheap look for the id first; then only a whole JSON line counts (a
                    # line torn by the crash does not, and is written again).
                    ids = {m.decode() for m in _ID.findall(line)} & wanted
                    if ids and line.endswith(b"\n"):
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(record, dict) and record.get("notification_id") in ids:
                            found.add(record["notification_id"])
        except FileNotFoundError:
            return set()
        except OSError as exc:
            raise DeliveryError(
                f"file channel {self.name}: cannot read {self.path} to find the lines an "
                f"interrupted write left: {exc.strerror or exc.__class__.__name__}",
                retryable=exc.errno not in _PERMANENT,
            ) from None
        return found

    def send(self, notification: Notification) -> None:
        error = self.send_batch([notification])[0]
        if error is not None:
            raise error

    def send_batch(self, notifications: Sequence[Notification]) -> list[DeliveryError | None]:
        """Append one line per notification; each line written in full counts as delivered."""
        lines = [n.to_json_bytes() + b"\n" for n in notifications]
        data = b"".join(lines)
        done = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _lock_for(self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    # A line torn by a crash (or a full disk) must not swallow the next one.
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        data = b"\n" + data
                        lines[0] = b"\n" + lines[0]
                    view = memoryview(data)
                    while done < len(data):  # a full disk part-way: finish what we can
                        done += os.write(fd, view[done:])
                finally:
                    os.close(fd)
        except OSError as exc:
            error = DeliveryError(
                f"file channel {self.name}: cannot append to {self.path}: "
                f"{exc.strerror or exc.__class__.__name__}",
                retryable=exc.errno not in _PERMANENT,
            )
            error.__cause__ = exc
            # The lines wholly written before the failure did arrive: only the rest failed.
            ends = itertools.accumulate(len(line) for line in lines)
            return [None if end <= done else error for end in ends]
        return [None] * len(lines)
