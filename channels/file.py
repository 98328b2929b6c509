"""Append each notification as one JSON line to a file."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

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

# One lock per file, shared by every channel writing it in this process.
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    key = os.path.realpath(path)
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


class FileChannel:
    """Appends `notification.to_json()` as one line of JSON (JSON Lines) to `path`.

    Each line goes out in a single write on an O_APPEND descriptor, under a per-file lock:
    lines from concurrent senders in one process never interleave, and appends from other
    processes land between whole lines on local filesystems.
    """

    def __init__(self, name: str, path: str | os.PathLike[str]):
        self.name = name
        self.path = Path(path).expanduser()

    def send(self, notification: Notification) -> None:
        line = notification.to_json_bytes() + b"\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _lock_for(self.path):
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    written = os.write(fd, line)
                    if written != len(line):  # a full disk part-way: finish the line
                        view = memoryview(line)[written:]
                        while view:
                            view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
        except OSError as exc:
            raise DeliveryError(
                f"file channel {self.name}: cannot append to {self.path}: "
                f"{exc.strerror or exc.__class__.__name__}",
                retryable=exc.errno not in _PERMANENT,
            ) from exc
