"""The adaptive polling bench runs, and its schedule keeps the envelope's promises."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cw_testing import REPO

# The end-to-end tier (`pytest -m e2e`, run by .ci/run after the fast tier).
pytestmark = pytest.mark.e2e


def test_bench_adaptive_runs_and_never_polls_too_soon() -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_adaptive.py", "--sources", "30", "--days", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("fixed ") and "mean detection delay" in line for line in lines)
    assert any(line.startswith("adaptive ") and "mean detection delay" in line for line in lines)
    assert any(line.startswith("budget: ") and "lower" in line for line in lines)
    # Correctness, not a figure: with 500s and 429s injected, no probe of the adaptive
    # schedule came sooner than min_interval after the last, nor before a Retry-After.
    assert "errors: probes sooner than min_interval or before Retry-After: 0" in lines


def test_bench_adaptive_reports_a_schedule_that_ignores_retry_after() -> None:
    # The checker itself can fail: a probe at once after a 429 asking for 15 minutes.
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from bench_adaptive import check
    finally:
        sys.path.remove(str(REPO / "bench"))

    def policy() -> float:
        return 0.0

    policy.min_interval = 120.0  # type: ignore[attr-defined]
    [found] = check(0, previous=0.0, at=600.0, following=630.0, retry_after=900.0, policy=policy)
    assert "ignores Retry-After" in found
    [found] = check(0, previous=0.0, at=60.0, following=600.0, retry_after=None, policy=policy)
    assert "< 120s" in found
