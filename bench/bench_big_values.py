"""Peak RSS and time of syncs of one large value, on DuckDB and PostgreSQL (issue 30).

For each backend, size (``--sizes``, in MB of 10^6 bytes) and shape (``--shapes``: ``text``, a
declared text column; ``json``, a declared json column holding an object with the value), a
child process syncs a loopback API's ``/items`` (the large record and a small one) twice into a
fresh warehouse: a first sync (both rows inserted) and a change sync (the large value replaced
by another of the same size: an update, old and new value both in the change log). The API
runs in this process, so the child's RSS is the sync's alone. Each sync's peak RSS is the
kernel's high-water mark (``VmHWM``), reset before it (``/proc/self/clear_refs``).

Sizes over the default ``max_value_bytes`` (32 MiB) are synced with it raised to fit, as a user
would: the figures say what that costs.

Run from the repository root::

    .venv/bin/python bench/bench_big_values.py                      # 20 and 100 MB, both shapes
    .venv/bin/python bench/bench_big_values.py --sizes 20 --shapes text --backends duckdb
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

PG_URL = os.environ.get("CHANGEWATCH_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
MIB = 1024 * 1024
DEFAULT_MAX_VALUE_BYTES = 32 * MIB


@cache
def body(size: int, shape: str, letter: str) -> bytes:
    """The ``/items`` answer: record 1 holds the large value, record 2 is small."""
    value = letter * size
    big = {"id": 1, "title": value} if shape == "text" else {"id": 1, "meta": {"blob": value}}
    return json.dumps([big, {"id": 2, "title": "small", "meta": {}}]).encode()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        data = body(int(query["size"]), query["shape"], query["letter"])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def hwm_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def child(url: str, backend: str, size: int, shape: str) -> None:
    """Two syncs of one large value; prints a JSON line of their times and peaks."""
    from changewatch.sources.rest import build_rest_source
    from changewatch.warehouse import connect
    from changewatch.warehouse.sync import run_sync

    columns = {"id": "bigint", "title": "text"} | ({"meta": "json"} if shape == "json" else {})
    value_bytes = size + (len('{"blob":""}') if shape == "json" else 0)
    limit = max(DEFAULT_MAX_VALUE_BYTES, value_bytes)

    def source(letter: str):  # noqa: ANN202
        return build_rest_source(
            {
                "name": "big",
                "type": "rest",
                "table": "items",
                "primary_key": "id",
                "columns": columns,
                "base_url": url,
                "path": "items",
                "params": {"size": str(size), "shape": shape, "letter": letter},
                "max_value_bytes": limit,
                "max_response_bytes": 2 * size + MIB,
            }
        )

    with tempfile.TemporaryDirectory() as tmp:
        if backend == "duckdb":
            warehouse = f"duckdb:///{tmp}/w.duckdb"
        else:
            warehouse = f"{PG_URL}?schema=bench_big_{uuid.uuid4().hex[:8]}"
        figures = {}
        with connect(warehouse) as wh:
            for kind, letter, expected in (("first", "x", (2, 0)), ("change", "y", (0, 1))):
                reset_hwm()
                started = time.perf_counter()
                stats = run_sync(wh, source(letter))
                elapsed = time.perf_counter() - started
                assert (stats.inserted, stats.updated) == expected, stats
                figures[kind] = {"seconds": elapsed, "peak_mib": hwm_mib()}
            if backend == "postgres":
                wh.execute(f"DROP SCHEMA {warehouse.rsplit('=', 1)[1]} CASCADE")
    print(json.dumps({"limit": limit, **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 100], help="MB each")
    parser.add_argument("--shapes", nargs="+", default=["text", "json"], choices=["text", "json"])
    parser.add_argument("--backends", nargs="+", default=["duckdb", "postgres"])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, backend, size, shape = args.child
        child(url, backend, int(size), shape)
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"{'backend':9} {'value':>7} {'shape':5}  {'first sync':>22}  {'change sync':>22}")
    failed = False
    try:
        for backend in args.backends:
            for size_mb in args.sizes:
                for shape in args.shapes:
                    size = size_mb * 1_000_000
                    for letter in "xy":  # made before the child starts: not in its time
                        body(size, shape, letter)
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", url, backend, str(size), shape],
                        capture_output=True,
                        text=True,
                        cwd=Path(__file__).resolve().parents[1],
                    )
                    label = f"{backend:9} {size_mb:>4} MB {shape:5}"
                    if done.returncode != 0:
                        failed = True
                        last = (done.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"{label}  FAILED: {last[:200]}")
                        continue
                    f = json.loads(done.stdout.strip().splitlines()[-1])
                    over = (
                        ""
                        if f["limit"] == DEFAULT_MAX_VALUE_BYTES
                        else (f"  (max_value_bytes raised to {f['limit'] / MIB:.0f} MiB)")
                    )
                    print(
                        f"{label}  {f['first']['seconds']:6.2f} s {f['first']['peak_mib']:7.0f} MiB"
                        f"  {f['change']['seconds']:6.2f} s {f['change']['peak_mib']:7.0f} MiB"
                        f"{over}",
                        flush=True,
                    )
    finally:
        server.shutdown()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
