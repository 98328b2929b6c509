"""The outage benchmark still runs end to end, on small numbers (its figures are bench/README's)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cw_testing import REPO

# About half a minute: the end-to-end tier (`pytest -m e2e`).
pytestmark = pytest.mark.e2e


def test_bench_outage_delivers_everything_once_on_a_small_queue() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/bench_outage.py",
            *("--notifications", "60", "--objects", "6", "--hours", "6", "--tick", "600"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "ALL MET"
    outage = next(line for line in lines if " outage " in line)
    assert "60 arrived, 0 duplicate(s), 0 out of order per object" in outage
    assert "1 request(s) on the first pass, 1 over 24 simulated h; channel disabled" in done.stdout
    assert "60 arrived, 0 duplicate(s), 0 dead" in done.stdout
