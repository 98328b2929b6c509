"""The slow-socket bench still runs end to end on a few sockets (its figures are its business:
only that every delivery was answered and the receiver's threads stayed few)."""

from __future__ import annotations

import json
import sys

import patience
import pytest
from cw_testing import REPO

# The end-to-end tier (`pytest -m e2e`, run by .ci/run after the fast tier).
pytestmark = pytest.mark.e2e


def test_bench_slow_sockets_answers_every_delivery_with_few_threads(tmp_path) -> None:
    figures_path = tmp_path / "figures.json"
    done = patience.run(
        [
            sys.executable,
            "bench/bench_slow_sockets.py",
            *("--slow", "60", "--deliveries", "10", "--spacing", "0.05", "--warmup", "1"),
            *("--json", str(figures_path)),
        ],
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    assert figures["statuses"] == {"202": 10}
    assert figures["open_at_start"] == 60
    assert figures["threads_max"] < 60  # not a thread per stalled socket
