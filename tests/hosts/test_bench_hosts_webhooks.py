"""bench/bench_hosts_webhooks.py, small: the receiver on the control host killed once while a
provider on the api host sends 200 deliveries; none acknowledged is lost."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cw_testing import REPO

pytestmark = pytest.mark.hosts


def test_the_receiver_killed_loses_no_acknowledged_delivery():
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_hosts_webhooks.py"),
            *("--deliveries", "200", "--rate", "10", "--kills", "1", "--sources", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-5000:]
    assert "acknowledged 200, not acknowledged 0" in out, out
    assert "not in the inbox 0, not consumed 0, change not recorded 0" in out, out
    assert "changes recorded twice 0" in out, out
    assert re.search(r"POST -> notification, 200 of 200 notified: p50 \d", out), out
    assert re.search(r"receiver down \(kill -> listening again\): \d+\.\d s$", out, re.M), out
    assert "TARGET MET: 0 acknowledged deliveries lost" in out, out
    assert "of which their change waits in a change-storm hold 0" in out, out
