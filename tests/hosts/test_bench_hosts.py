"""bench/bench_hosts.py, small: both parts run and print their figures, nothing lost."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cw_testing import REPO

pytestmark = pytest.mark.hosts


def test_bench_hosts_prints_its_figures_and_loses_nothing():
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_hosts.py"),
            "--sources",
            "4",
            "--interval",
            "10",
            "--minutes",
            "0.5",
            "--change",
            "1",
            "--kills",
            "1",
            "--kill-sources",
            "2",
            "--warmup",
            "600",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    rows = re.findall(r"^\s+([12])\s+(\d+\.\d)\s+(\d+)\s+(\d+)\s", out, flags=re.M)
    assert [r[0] for r in rows] == ["1", "2"], out
    for _, syncs, made, notified in rows:
        assert float(syncs) > 0 and int(made) > 0 and int(notified) == int(made), out
    assert "2 workers / 1 worker:" in out
    assert re.search(r"lost changes 0, doubled changes 0, lost notifications 0", out), out
    assert "under another webhook-id: 0" in out, out
