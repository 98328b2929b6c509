"""Slow-socket bench: valid webhook deliveries answered while a thousand sockets stall.

Issue 30's figure for the receiver (docs/security.md "The webhook receiver"). It starts
``changewatch webhooks`` as deployed (its own process, a watches file with one GitHub-style
``webhook:`` source, the inbox a fresh SQLite file), then keeps ``--slow`` sockets open to it
that each send a request line and a header byte by byte, ``--drip`` seconds apart, and never
finish their headers (a slowloris): a socket the receiver closes is opened again, so
``--slow`` stall at every moment. Meanwhile ``--deliveries`` signed deliveries are POSTed one
after another, ``--spacing`` seconds apart, each on a new connection.

Printed: the deliveries' answers (all 202 expected), their latency p50 / p95 / max (POST to
answer), the receiver's threads (most seen, sampled every 0.2 s from /proc), its peak RSS,
how many stalled sockets it closed (its header deadline), and how many were open at the end
of the warm-up. ``--json PATH`` writes the figures.

Run from the repository root::

    .venv/bin/python bench/bench_slow_sockets.py                 # 1,000 slow, 200 deliveries
    .venv/bin/python bench/bench_slow_sockets.py --slow 100 --deliveries 20
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
SECRET = "bench-slow-sockets-s3cret"
BODY = b'{"action": "edited", "issue": {"number": 1}}'


def watches(folder: Path) -> Path:
    path = folder / "watches.yaml"
    path.write_text(
        "sources:\n"
        "  - name: gh\n"
        "    type: rest\n"
        "    base_url: http://127.0.0.1:9\n"
        "    path: /issues\n"
        "    table: issues\n"
        "    primary_key: number\n"
        "    columns: {number: bigint}\n"
        "    webhook: {path: /hooks/gh, secret_env: BENCH_HOOK_SECRET, provider: github}\n"
        "watches: []\n"
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Stallers:
    """``count`` sockets that drip a header byte every ``drip`` seconds and never end it;
    one the server closes is replaced. Runs on a thread of its own."""

    def __init__(self, port: int, count: int, drip: float) -> None:
        self.port, self.count, self.drip = port, count, drip
        self.closed_by_server = 0
        self.open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stallers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _connect(self, selector: selectors.BaseSelector) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setblocking(False)
        sock.send(b"POST /hooks/gh HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
        selector.register(sock, selectors.EVENT_READ)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for _ in range(self.count):
            self._connect(selector)
        next_drip = time.monotonic() + self.drip
        while not self._stop.is_set():
            for key, _ in selector.select(0.05):
                sock = key.fileobj
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data or data.startswith(b"HTTP/"):
                    selector.unregister(sock)
                    sock.close()
                    self.closed_by_server += 1
                    self._connect(selector)
            if time.monotonic() >= next_drip:
                next_drip += self.drip
                for key in list(selector.get_map().values()):
                    try:
                        key.fileobj.send(b"a")
                    except OSError:
                        pass
            self.open = len(selector.get_map())
        for key in list(selector.get_map().values()):
            key.fileobj.close()
        selector.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=1000, help="stalled sockets held open")
    parser.add_argument("--deliveries", type=int, default=200, help="valid deliveries")
    parser.add_argument("--spacing", type=float, default=0.1, help="seconds between them")
    parser.add_argument("--drip", type=float, default=1.0, help="seconds between header bytes")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds stalled before")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        folder = Path(tmp)
        port = free_port()
        env = {
            **os.environ,
            "CHANGEWATCH_CONFIG": str(watches(folder)),
            "CHANGEWATCH_WEBHOOK_INBOX": str(folder / "inbox.sqlite"),
            "BENCH_HOOK_SECRET": SECRET,
        }
        command = [sys.executable, "-m", "changewatch.pipeline.cli", "webhooks"]
        receiver = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            line = receiver.stdout.readline()
            if "receiving webhooks" not in line:
                print(line + receiver.stdout.read(), file=sys.stderr)
                return 1
            # Drain its log so a full pipe never blocks it.
            threading.Thread(target=receiver.stdout.read, daemon=True).start()
            figures = measure(receiver.pid, port, args)
        finally:
            receiver.terminate()
            receiver.wait(10)
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0 if figures["statuses"] == {"202": args.deliveries} else 1


def measure(pid: int, port: int, args: argparse.Namespace) -> dict:
    threads, done = [], threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            threads.append(proc_status(pid, "Threads"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    waits, statuses = [], {}
    with Stallers(port, args.slow, args.drip) as stallers:
        time.sleep(args.warmup)
        open_at_start = stallers.open
        with httpx.Client(timeout=30) as client:
            for n in range(args.deliveries):
                mac = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
                headers = {
                    "X-Hub-Signature-256": f"sha256={mac}",
                    "X-GitHub-Delivery": f"bench-{n}",
                    "X-GitHub-Event": "issues",
                    "Connection": "close",
                }
                started = time.perf_counter()
                try:
                    status = str(
                        client.post(
                            f"http://127.0.0.1:{port}/hooks/gh", content=BODY, headers=headers
                        ).status_code
                    )
                except httpx.HTTPError as error:
                    status = type(error).__name__
                waits.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
                time.sleep(args.spacing)
        closed = stallers.closed_by_server
    done.set()
    sampler.join()
    waits.sort()
    return {
        "slow": args.slow,
        "open_at_start": open_at_start,
        "deliveries": args.deliveries,
        "statuses": statuses,
        "p50_ms": round(statistics.median(waits) * 1000, 1),
        "p95_ms": round(waits[max(0, int(len(waits) * 0.95) - 1)] * 1000, 1),
        "max_ms": round(waits[-1] * 1000, 1),
        "threads_max": max(threads, default=0),
        "rss_peak_mib": round(proc_status(pid, "VmHWM") / 1024, 1),
        "stalled_closed_by_receiver": closed,
    }


def report(f: dict) -> None:
    print(f"stalled sockets held open: {f['slow']} ({f['open_at_start']} open after warm-up)")
    print(f"valid deliveries: {f['deliveries']}, answers {f['statuses']}")
    print(
        f"latency POST -> answer: p50 {f['p50_ms']} ms, p95 {f['p95_ms']} ms, max {f['max_ms']} ms"
    )
    print(f"receiver threads (most seen): {f['threads_max']}; peak RSS {f['rss_peak_mib']} MiB")
    print(
        f"stalled sockets closed by the receiver's header deadline: "
        f"{f['stalled_closed_by_receiver']}"
    )


if __name__ == "__main__":
    sys.exit(main())
