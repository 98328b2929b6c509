"""CPU of an unchanged poll: a change probe in a long-lived process vs a `changewatch sync` run.

Starts the demo API (``--issues`` issues) in its own process, so its CPU is not counted, and
declares N REST sources on it (each its own URL: an extra query parameter the API ignores).
Then, in this process, as the sync sensor does in the code server:

* a first round probes every source (no state yet: each says "changed");
* ``--rounds`` more rounds find nothing changed: ``due_probes`` + ``probe_all`` + ``decide``
  (pipeline/polling/probe_decisions.py), the cursor carried from round to round.

Printed per unchanged probe: CPU of this process (``time.process_time``, every thread: the
probe pool's and the connection pool's work) and of the calling thread alone
(``time.thread_time``: the decision and the pool's bookkeeping), and wall time per round, for
each N in ``--sources`` (default 100 and 1000). Beside them, the CPU of one
``changewatch sync <source>`` subprocess for an unchanged source (its second sync; measured
with ``resource.getrusage(RUSAGE_CHILDREN)``), which is the least a Dagster run per poll costs,
and whether the issue's target (``TARGET_MS`` of CPU per unchanged poll in the long-lived
process) is met.

Run from the repository root::

    .venv/bin/python bench/bench_probe.py
    .venv/bin/python bench/bench_probe.py --sources 100 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml
from changewatch.pipeline.polling.probe_decisions import decide, due_probes, probe_states
from changewatch.pipeline.project.storage_paths import WAREHOUSE_URL_ENV
from changewatch.sources.probe import ProbeClients, probe_all
from changewatch.sources.rest import RestSourceConfig

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 20.0
INTERVAL = 300.0


def source_settings(name: str, base_url: str, index: int) -> dict:
    return {
        "name": name,
        "type": "rest",
        "base_url": base_url,
        "path": "/repos/acme/widgets/issues",
        # `bench` makes each source's URL its own; the demo API ignores it.
        "params": {"state": "all", "per_page": 100, "bench": index},
        "paginator": {"type": "link_header"},
        "table": name,
        "primary_key": "number",
        "updated_at": "updated_at",
        "interval": f"{INTERVAL:g}s",
        "columns": {"number": "bigint", "title": "text", "updated_at": "timestamp"},
    }


@contextmanager
def demo_api(issues: int) -> Iterator[str]:
    """The demo API in its own process; its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "changewatch.sources.demo.server", "--port", "0"]
        + ["--issues", str(issues)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if " at " not in line:
            raise SystemExit(f"the demo API did not start: {line!r}")
        url = line.split(" at ")[1].split()[0]
        httpx.get(f"{url}/repos/acme/widgets/issues", timeout=30).raise_for_status()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def probe_rounds(base_url: str, count: int, rounds: int) -> dict[str, float]:
    """CPU and wall time per unchanged probe of ``count`` sources over ``rounds`` rounds."""
    configs = [
        RestSourceConfig.model_validate(source_settings(f"s{i:05d}", base_url, i))
        for i in range(count)
    ]
    with ProbeClients() as clients:
        cursor: str | None = None
        now = 1_800_000_000.0 - 1_800_000_000.0 % INTERVAL

        def tick() -> int:
            nonlocal cursor
            due = due_probes(configs, cursor, now)
            results = probe_all(due, probe_states(cursor), clients)
            errors = [r.error for r in results.values() if r.error]
            if errors:
                raise SystemExit(f"{len(errors)} probes failed, e.g. {errors[0]}")
            decision = decide(configs, cursor, results, now)
            cursor = decision.cursor
            return len(decision.requests)

        assert tick() == count  # first probes: every source "changed"
        process, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
        for _ in range(rounds):
            now += INTERVAL  # each round is the next interval slot: every source is due
            requested = tick()
            assert requested == 0, f"{requested} syncs requested with nothing changed"
        probes = count * rounds
        return {
            "process_ms": (time.process_time() - process) * 1000 / probes,
            "thread_ms": (time.thread_time() - thread) * 1000 / probes,
            "round_s": (time.perf_counter() - wall) / rounds,
            "cursor_bytes": len(cursor or ""),
        }


def sync_subprocess_cpu(base_url: str) -> float:
    """Core-seconds of one `changewatch sync` of an unchanged source (its second sync)."""
    with tempfile.TemporaryDirectory(prefix="bench_probe_") as folder:
        config = Path(folder) / "watches.yaml"
        settings = source_settings("unchanged", base_url, 0)
        config.write_text(yaml.safe_dump({"version": 1, "sources": [settings]}), "utf-8")
        env = {
            **os.environ,
            "CHANGEWATCH_CONFIG": str(config),
            WAREHOUSE_URL_ENV: f"duckdb:///{Path(folder) / 'warehouse.duckdb'}",
        }
        command = [str(REPO / ".venv" / "bin" / "changewatch"), "sync", "unchanged"]
        if not Path(command[0]).exists():
            command = [sys.executable, "-m", "changewatch.pipeline.cli", "sync", "unchanged"]
        cost = 0.0
        for attempt in ("first", "unchanged"):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise SystemExit(f"the {attempt} sync failed: {done.stderr.strip()[-500:]}")
            cost = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3, help="unchanged rounds per N")
    parser.add_argument("--issues", type=int, default=40, help="issues the API serves")
    parser.add_argument("--no-sync", action="store_true", help="skip the subprocess sync")
    args = parser.parse_args(argv)
    with demo_api(args.issues) as url:
        print(f"demo API at {url}, {args.issues} issues; {args.rounds} unchanged rounds per N")
        worst = 0.0
        for count in args.sources:
            figures = probe_rounds(url, count, args.rounds)
            worst = max(worst, figures["process_ms"])
            print(
                f"probe, {count:,} sources: {figures['process_ms']:.2f} ms CPU per unchanged "
                f"probe (process, all threads), {figures['thread_ms']:.2f} ms in the calling "
                f"thread, {figures['round_s']:.2f} s wall per round, cursor "
                f"{figures['cursor_bytes']:,} bytes"
            )
        if not args.no_sync:
            cost = sync_subprocess_cpu(url)
            print(f"changewatch sync subprocess, unchanged source: {cost * 1000:.0f} ms CPU")
            print(f"ratio sync run / probe: {cost * 1000 / max(worst, 1e-9):,.0f}x")
    verdict = "TARGET MET" if worst <= TARGET_MS else "TARGET MISSED"
    print(f"{verdict}: worst {worst:.2f} ms CPU per unchanged poll (target {TARGET_MS:g} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
