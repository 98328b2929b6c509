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

``--least-limit`` prints instead, for each size and shape, the least DuckDB memory limit (in
8 MiB steps, by bisection, a child process a try) under which a sync still stores the value:
of the stage while it normalizes the document (``sources.staged.PARSE_BYTES_PER_BYTE``) and
of a DuckDB warehouse while it writes the rows (``warehouse.backends._VALUE_ROOM``), each
as a multiple of the document: where those two factors come from. The stage never goes below
its usual 160 MB, so a figure under that says only that the usual limit is enough.

Run from the repository root::

    .venv/bin/python bench/bench_big_values.py                      # 20 and 100 MB, both shapes
    .venv/bin/python bench/bench_big_values.py --sizes 20 --shapes text --backends duckdb
    .venv/bin/python bench/bench_big_values.py --least-limit --sizes 10 25.7 52.4
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


def probe(url: str, step: str, size: int, shape: str, limit_mib: int) -> None:
    """One sync into a DuckDB warehouse with ``step``'s memory limit at ``limit_mib`` MiB (the
    other's ample); prints ``ok`` or ``oom``."""
    from changewatch.sources import staged
    from changewatch.warehouse import backends

    document = len(body(size, shape, "x"))
    limit = limit_mib * MIB
    staged.PARSE_BYTES_PER_BYTE = limit / document if step == "stage" else 64
    if step == "warehouse":  # the limit from the start, below the usual 128 MB floor too
        backends.MEMORY_LIMIT, backends._MEMORY_LIMIT_BYTES = f"{limit_mib}MiB", limit
        backends._VALUE_ROOM = 0
    else:
        backends._VALUE_ROOM = 64
    try:
        child(url, "duckdb", size, shape, changes=False)
    except Exception as error:  # noqa: BLE001 - an out-of-memory error in any wrapping
        if "Out of Memory" not in str(error):
            raise
        print("oom")
        return
    print("ok")


def least_limit(url: str, step: str, size: int, shape: str) -> int:
    """The least limit (MiB, 8 MiB steps) under which ``probe`` passes."""
    low, high = 8, 8192  # low fails (or is below any floor), high passes
    while high - low > 8:
        middle = (low + high) // 2
        done = subprocess.run(
            [sys.executable, __file__, "--probe", url, step, str(size), shape, str(middle)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        answer = (done.stdout.strip().splitlines() or ["?"])[-1]
        if answer not in ("ok", "oom"):
            raise SystemExit(f"probe failed: {done.stderr.strip()[-500:]}")
        low, high = (low, middle) if answer == "ok" else (middle, high)
    return high


def least_limits(url: str, sizes: list[float], shapes: list[str]) -> None:
    print(f"{'value':>9} {'shape':5}  {'stage (normalize)':>26}  {'DuckDB warehouse (write)':>26}")
    for size_mib in sizes:
        for shape in shapes:
            size = int(size_mib * MIB)
            document = len(body(size, shape, "x"))
            stage = least_limit(url, "stage", size, shape)
            warehouse = least_limit(url, "warehouse", size, shape)
            print(
                f"{size_mib:>5g} MiB {shape:5}  {stage:7} MiB = {stage * MIB / document:5.1f}x doc"
                f"  {warehouse:7} MiB = {warehouse * MIB / document:5.1f}x doc",
                flush=True,
            )


def child(url: str, backend: str, size: int, shape: str, *, changes: bool = True) -> None:
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
            syncs = (("first", "x", (2, 0)), ("change", "y", (0, 1)))
            for kind, letter, expected in syncs if changes else syncs[:1]:
                reset_hwm()
                started = time.perf_counter()
                stats = run_sync(wh, source(letter))
                elapsed = time.perf_counter() - started
                assert (stats.inserted, stats.updated) == expected, stats
                figures[kind] = {"seconds": elapsed, "peak_mib": hwm_mib()}
            if backend == "postgres":
                wh.execute(f"DROP SCHEMA {warehouse.rsplit('=', 1)[1]} CASCADE")
    if changes:
        print(json.dumps({"limit": limit, **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[20, 100], help="MB each")
    parser.add_argument("--shapes", nargs="+", default=["text", "json"], choices=["text", "json"])
    parser.add_argument("--backends", nargs="+", default=["duckdb", "postgres"])
    parser.add_argument(
        "--least-limit", action="store_true", help="the least memory limits (sizes in MiB)"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, backend, size, shape = args.child
        child(url, backend, int(size), shape)
        return
    if args.probe:
        url, step, size, shape, limit = args.probe
        probe(url, step, int(size), shape, int(limit))
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    if args.least_limit:
        try:
            least_limits(url, args.sizes, args.shapes)
        finally:
            server.shutdown()
        return
    print(f"{'backend':9} {'value':>7} {'shape':5}  {'first sync':>22}  {'change sync':>22}")
    failed = False
    try:
        for backend in args.backends:
            for size_mb in args.sizes:
                for shape in args.shapes:
                    size = int(size_mb * 1_000_000)
                    for letter in "xy":  # made before the child starts: not in its time
                        body(size, shape, letter)
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", url, backend, str(size), shape],
                        capture_output=True,
                        text=True,
                        cwd=Path(__file__).resolve().parents[1],
                    )
                    label = f"{backend:9} {size_mb:>4g} MB {shape:5}"
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
