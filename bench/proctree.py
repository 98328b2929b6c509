"""The process trees a bench starts: their CPU and memory, read from /proc (Linux), and
starting and stopping them (a child that dies with the bench, a whole tree ended, a free
loopback port and whether something listens on it).

A tree's CPU is each member's own user+system time plus the time of the children it has
reaped (``cutime``+``cstime``): a run worker counts while it runs (a zombie too) and, once its
parent waits for it, through its parent, so the sum never drops when a worker ends. Only a
process outliving its parent loses its time (init reaps it). A snapshot is taken twice when a
member ends while it is being read, so no time is counted twice or missed at that moment.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Proc",
    "cmdline",
    "cpu_seconds",
    "die_with_parent",
    "free_port",
    "hwm_bytes",
    "listening",
    "rss_bytes",
    "snapshot",
    "stop_tree",
    "tree",
]

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Proc:
    """One process as /proc showed it: CPU seconds of its own and of reaped children, RSS."""

    pid: int
    ppid: int
    own: float
    reaped: float
    rss: int  # bytes


def _read(pid: int) -> Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # ended (and reaped) meanwhile
    # Fields after the command name, which may hold spaces and parentheses.
    fields = text.rsplit(")", 1)[1].split()
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        own=(int(fields[11]) + int(fields[12])) / _TICK,
        reaped=(int(fields[13]) + int(fields[14])) / _TICK,
        rss=int(fields[21]) * _PAGE,
    )


def _scan() -> dict[int, Proc]:
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (proc := _read(int(entry.name))) is not None:
            found[proc.pid] = proc
    return found


def tree(procs: dict[int, Proc], roots: Iterable[int]) -> dict[int, Proc]:
    """``roots`` and their descendants among ``procs``."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    todo = [pid for pid in roots if pid in procs]
    found: dict[int, Proc] = {}
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = procs[pid]
            todo.extend(children.get(pid, ()))
    return found


def snapshot(roots: Iterable[int], *, attempts: int = 5) -> dict[int, Proc]:
    """The processes of the trees under ``roots``, read consistently.

    A member reaped during a scan would be counted twice (read, then in its parent's
    ``reaped``) or not at all: the scan is repeated until two in a row hold the same members
    and all of them still exist after the second.
    """
    roots = list(roots)
    before = set(tree(_scan(), roots))
    procs: dict[int, Proc] = {}
    for _ in range(attempts):
        procs = tree(_scan(), roots)
        if set(procs) == before and all(os.path.exists(f"/proc/{pid}") for pid in procs):
            return procs
        before = set(procs)
    return procs  # members keep ending: the error is one worker's time at most


def cmdline(pid: int) -> str:
    """A process's command line, words joined by spaces ("" once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def rss_bytes(pid: int) -> int:
    """The process's resident memory now, 0 once it has ended."""
    proc = _read(pid)
    return proc.rss if proc else 0


def hwm_bytes(pid: int) -> int:
    """The process's peak RSS so far (``VmHWM``), 0 once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(root: int) -> float:
    """User+system CPU of ``root``'s tree so far, reaped children (ended run workers) included."""
    return sum(p.own + p.reaped for p in snapshot([root]).values())


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child imports nothing
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child (``preexec_fn``): be killed when the bench dies, even by SIGKILL (a test's
    timeout), so no daemon or code server outlives it (the code server's own server stops
    without the heartbeats of its proxy)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_tree(proc: subprocess.Popen) -> None:
    """End ``proc`` and everything under it, by pid: TERM, then KILL what is left."""
    pids = list(tree(snapshot([proc.pid]), [proc.pid]))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            time.sleep(1)  # the code server's workers end after it
    proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
