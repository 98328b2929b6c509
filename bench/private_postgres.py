"""A private PostgreSQL server for a bench, so the server's CPU is the bench's alone.

The machine's server at 127.0.0.1:5432 is shared with everything else running (test suites,
other benches): its CPU cannot be told apart. This one is made with initdb in a temporary
folder, listens on loopback at a free port, and is removed afterwards. Its CPU is the
postmaster's own, its live children's (backends, background workers) and what it has
collected of its children that ended (``cutime``/``cstime``), read from /proc.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivatePostgres", "private_postgres"]

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class PrivatePostgres:
    url: str  # postgresql://postgres@127.0.0.1:<port>/postgres
    pid: int  # the postmaster's
    pg_ctl: list[str]  # pg_ctl (as the postgres user when root) with its data folder

    def stop(self) -> None:
        """Stop the server at once (fast shutdown: sessions ended, nothing waits)."""
        subprocess.run([*self.pg_ctl, "-w", "-m", "fast", "stop"], check=True, capture_output=True)

    def start(self) -> None:
        """Start it again, on the same port and data; ``pid`` is the new postmaster's."""
        subprocess.run([*self.pg_ctl, "-w", "start"], check=True, capture_output=True)
        self.pid = int((Path(self.pg_ctl[-1]) / "postmaster.pid").read_text().splitlines()[0])

    def cpu_seconds(self) -> float:
        """The server's CPU (user + system) so far, in seconds."""
        total = _stat(self.pid, with_children=True)
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and _ppid(int(entry.name)) == self.pid:
                total += _stat(int(entry.name), with_children=False)
        return total / TICKS


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A fresh PostgreSQL server (fsync off: durability is not what a bench measures)."""
    binaries = Path(
        subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    )
    folder = Path(tempfile.mkdtemp(prefix="bench_pg_"))
    data = folder / "data"
    # initdb refuses root: as root, the server runs as the postgres user.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        folder.chmod(0o755)
        shutil.chown(folder, "postgres", "postgres")
    port = _free_port()
    try:
        subprocess.run(
            [
                *as_user,
                binaries / "initdb",
                "-D",
                data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
        )
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {port}\n"
                f"unix_socket_directories = '{folder}'\nmax_connections = 200\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            )
        pg_ctl = [*as_user, str(binaries / "pg_ctl"), "-l", str(folder / "server.log"), "-D"]
        server = PrivatePostgres(
            f"postgresql://postgres@127.0.0.1:{port}/postgres", 0, [*pg_ctl, str(data)]
        )
        server.start()
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_user, binaries / "pg_ctl", "-D", data, "-w", "-m", "immediate", "stop"],
                capture_output=True,
            )
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fields(pid: int) -> list[str]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # it ended meanwhile: its parent has collected it
        return []
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) "


def _ppid(pid: int) -> int:
    fields = _fields(pid)
    return int(fields[1]) if fields else -1


def _stat(pid: int, *, with_children: bool) -> int:
    """utime + stime (+ cutime + cstime), in clock ticks (fields 14-17 of /proc/pid/stat)."""
    fields = _fields(pid)
    if not fields:
        return 0
    ticks = [int(v) for v in fields[11:15]]
    return sum(ticks) if with_children else ticks[0] + ticks[1]
