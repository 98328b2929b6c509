"""The webhook bench still runs end to end on a handful of events (figures are its business,
not this test's: only that it measured them, and what must hold at any speed)."""

from __future__ import annotations

import json
import sys

import patience
import pytest
from cw_testing import REPO

# The end-to-end tier (`pytest -m e2e`, run by .ci/run after the fast tier).
pytestmark = pytest.mark.e2e


@pytest.mark.heavy  # a real daemon and code server: started first
def test_bench_webhooks_notifies_each_change_once_and_stores_no_forgery(tmp_path) -> None:
    figures_path = tmp_path / "figures.json"
    done = patience.run(
        [
            sys.executable,
            "bench/bench_webhooks.py",
            *("--events", "4", "--spacing", "1", "--drop", "0.25", "--tail-drops", "0"),
            *("--retry-within", "2", "--forged", "5", "--json", str(figures_path)),
        ],
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    # Three events had a webhook (each sent twice: 202, then 200), one had none and was
    # notified all the same, by the next sync.
    assert figures["statuses"] == {"first 202": 3, "retry 200": 3}
    assert figures["webhook_p95"] is not None
    assert figures["dropped"]["amid"][0] == 1 and figures["missing"] == 0
    assert figures["duplicate_ids"] == figures["duplicate_versions"] == 0
    assert figures["changes_twice"] == 0
    # One forgery of each kind, none stored; the replay (a stored id, another body, the
    # captured signature) is refused like the rest.
    assert figures["forged"] == {
        "bad signature": [401],
        "no signature": [401],
        "stale timestamp": [401],
        "replayed id": [401],
        "oversized": [413],
    }
    assert figures["forged_stored"] == 0
    assert figures["runs"].get("webhook", 0) >= 1 and figures["runs_failed"] == 0
    for line in ("POST -> notification", "run started -> notified", "TARGET"):
        assert line in done.stdout
