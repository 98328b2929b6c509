"""The benchmark still runs end to end (figures are its business, not this test's)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cw_testing import REPO


@pytest.mark.parametrize("server", ["process", "thread"])
def test_bench_sync_runs_on_a_small_listing(server: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/bench_sync.py",
            *("--rows", "3000", "--rounds", "1", "--server", server),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ratio first sync (bulk load) / fetch-only" in done.stdout
    assert "re-sync, 1k upd/100 del" in done.stdout
    # Each kind of sync's own peak RSS, at the row count asked for.
    assert "peak RSS first sync, 3,000 rows: " in done.stdout
    assert "peak RSS re-sync, 3,000 rows: " in done.stdout


def test_bench_notify_runs_on_both_backends() -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_notify.py", *("--changes", "300", "--rounds", "1")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("duckdb ") and line.split()[1] != "round" for line in lines)
    assert any(line.startswith("postgres ") and line.split()[1] != "round" for line in lines)
    assert "notifications/s" in done.stdout


def test_bench_probe_runs_on_a_few_sources() -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_probe.py", *("--sources", "5", "--rounds", "1", "--no-sync")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "probe, 5 sources: " in done.stdout
    assert "per unchanged poll" in done.stdout
