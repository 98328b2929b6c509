"""Hosts as Linux network namespaces, joined by veth pairs to a bridge in a switch namespace.

Each host has its own loopback and one address on a private /24; nothing of the machine's
network is touched (the bridge itself lives in a namespace of its own), and a host reaches
another only over that address. Processes start in a host with ``ip netns exec``; the test's
own sockets enter a host with ``Host.entered()`` (``setns`` applies to the calling thread,
and a socket stays in the namespace it was made in). Root only, as CI runs.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["Host", "Network"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


class Host:
    """One namespace: its name, its address, its processes."""

    def __init__(self, network: Network, name: str, address: str):
        self.network, self.name, self.address = network, name, address
        self.netns = f"{network.prefix}-{name}"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: list[str], **options) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **options)

    def run(self, argv: list[str], **options) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **options)

    def pids(self) -> list[int]:
        done = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False
        )
        return [int(p) for p in done.stdout.split()]

    def kill_all(self, timeout: float = 10.0) -> int:
        """SIGKILL every process of this host, as a power cut would; how many there were.
        Loops: a process may fork while its siblings die."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {pids} survive SIGKILL")
            time.sleep(0.05)
        return len(killed)

    @contextmanager
    def entered(self) -> Iterator[None]:
        """Sockets made by this thread inside the block belong to this host."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(own)
            os.close(target)

    def __repr__(self) -> str:
        return f"Host({self.name} {self.address})"


class Network:
    """A bridge and the hosts on it; everything removed on leaving (processes killed first)."""

    def __init__(self) -> None:
        # Short: interface and namespace names carry it (interfaces take 15 characters).
        self.prefix = f"cw{uuid.uuid4().hex[:5]}"
        self.subnet = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}

    def __enter__(self) -> Network:
        ip("netns", "add", self.switch)
        try:
            ip("-n", self.switch, "link", "set", "lo", "up")
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def add(self, name: str) -> Host:
        """A new host on the bridge, with the next address."""
        host = Host(self, name, f"{self.subnet}.{len(self.hosts) + 10}")
        port = f"p{len(self.hosts)}{self.prefix}"
        ip("netns", "add", host.netns)
        self.hosts[name] = host
        ip("-n", host.netns, "link", "set", "lo", "up")
        ip(
            "-n",
            host.netns,
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            self.switch,
        )
        ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        return host

    def __exit__(self, *exc: object) -> None:
        for host in self.hosts.values():
            try:
                host.kill_all()
            finally:
                subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        leftover = [p.name for p in Path("/run/netns").glob(f"{self.prefix}-*")]
        assert not leftover, f"namespaces left behind: {leftover}"
