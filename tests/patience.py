"""Waiting on subprocesses by the work they do, not by the wall clock.

A loaded machine (load average 10 on two cores) makes every step slower but not stuck: the
processes keep using CPU, or the awaited thing keeps moving. So a wait here fails when
neither happened for a while (a hang), or when it took several times as long as the same work
took the first process to do it; never after a fixed number of seconds of work.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["STALL_S", "cpu_seconds", "descendants", "reaped", "run", "wait_working"]

# How long the watched processes may do no work at all (less than MIN_WORK_S of CPU between
# them, and no progress) before a wait fails: a hang, not slowness.
STALL_S = 60.0
MIN_WORK_S = 0.5
_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # gone


def _tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and all their descendants (a code server's run workers, say)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            parents[int(entry.name)] = int(fields[1])
    found = set(roots)
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def descendants(pid: int) -> set[int]:
    """The processes ``pid`` started, and theirs (a test's code server and run workers, say)."""
    return _tree([pid]) - {pid}


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU time used so far by ``pids`` and their descendants, exited ones included once their
    parent has reaped them (a code server's finished run workers): the sum does not drop
    when a busy child ends, which would look like a stall until the others made it up."""
    total = 0
    for pid in _tree(pids):
        fields = _stat(pid)
        if fields:
            # utime, stime, and cutime, cstime: those of the children it has waited for.
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / _TICK


def wait_working(
    done: Callable[[], bool],
    *,
    pids: Callable[[], Iterable[int]],
    what: str,
    progress: Callable[[], object] = lambda: None,
    limit: float | None = None,
    stall: float = STALL_S,
    poll: float = 0.2,
) -> float:
    """Poll ``done()`` until it is true; return the seconds it took.

    Raises ``AssertionError`` naming ``what`` when, for ``stall`` seconds, the processes
    ``pids()`` (with their children) used less than MIN_WORK_S of CPU between them and
    ``progress()`` did not change; or when ``limit`` seconds (derived by the caller from
    work already done, never a guess) have passed.
    """
    start = time.monotonic()
    last_cpu, last_progress, last_change = cpu_seconds(pids()), progress(), start
    while not done():
        now = time.monotonic()
        cpu, moved = cpu_seconds(pids()), progress()
        if cpu - last_cpu >= MIN_WORK_S or moved != last_progress:
            last_cpu, last_progress, last_change = cpu, moved, now
        elif now - last_change > stall:
            raise AssertionError(
                f"{what}: stuck, no work and no progress for {stall:g}s "
                f"(after {now - start:.0f}s; progress: {moved})"
            )
        if limit is not None and now - start > limit:
            raise AssertionError(f"{what}: not done after {limit:.0f}s (progress: {moved})")
        time.sleep(poll)
    return time.monotonic() - start


@contextmanager
def reaped(procs: list[subprocess.Popen]) -> Iterator[list[subprocess.Popen]]:
    """On leaving, however that happens, kill what still runs, reap it and close its pipes:
    a failed test leaves no process, no zombie and no open pipe for the next one to warn of."""
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.communicate()  # waits, drains and closes stdout/stderr


def run(
    command: list[str], *, what: str | None = None, limit: float | None = None, **options: object
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, **options)``, waiting while
    the process works instead of for a fixed timeout; killed and reaped if the wait fails.

    The output goes through temporary files, so a chatty process never blocks on a full pipe.
    ``limit`` (seconds) only where a caller has a reason beyond the work; by default none.
    """
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        reaped([]) as procs,
    ):
        procs.append(subprocess.Popen(command, stdout=out, stderr=err, text=True, **options))
        proc = procs[0]
        wait_working(
            lambda: proc.poll() is not None,
            pids=lambda: [proc.pid],
            what=what or " ".join(map(str, command))[:200],
            limit=limit,
        )
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read())
