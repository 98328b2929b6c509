"""`changewatch feedback-server` in its own process: it keeps no DuckDB file open between
requests, answers 503 while another process holds the file, and a taken port is one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
from changewatch.channels.feedback import feedback_signature
from changewatch.warehouse import connect
from changewatch.warehouse.schema import ensure_delivery_tables
from test_cli import run_cli

SECRET = "cli-fb-s3cret"
NOTIFICATION = "ntf_0123456789abcdef0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_feedback_server_from_the_command_line(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    with connect(url) as wh, wh.transaction():
        ensure_delivery_tables(wh)
        wh.execute(
            # Named columns: the table grows (debounce added three nullable ones).
            "INSERT INTO outbox (notification_id, dedupe_key, watch, source, object_key, kind, "
            "change_id, title, body, url, urgency, summary, payload, created_at) VALUES "
            "($1, 'k', 'w', 's', '7', 'insert', 1, 't', 'b', NULL, 'normal', NULL, '{}', $2)",
            (NOTIFICATION, datetime.now(UTC)),
        )
    port = free_port()
    (tmp_path / "watches.yaml").write_text(
        f"feedback:\n  url: http://127.0.0.1:{port}\n  secret_env: CW_TEST_FEEDBACK_SECRET\n"
    )
    env = {"CW_TEST_FEEDBACK_SECRET": SECRET, "CHANGEWATCH_WAREHOUSE_URL": url}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CHANGEWATCH_")} | env
    server = subprocess.Popen(
        [sys.executable, "-m", "changewatch.pipeline.cli", "feedback-server", "--port", str(port)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith(f"feedback server on http://127.0.0.1:{port}")
        link = f"http://127.0.0.1:{port}/feedback/{NOTIFICATION}/useful"
        sig = feedback_signature(SECRET.encode(), NOTIFICATION, "useful")

        # Another process (this one) holds the DuckDB file: try again later, nothing recorded.
        with connect(url) as held:
            busy = httpx.post(link, data={"sig": sig}, timeout=10)
            assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
            assert held.fetch("SELECT count(*) FROM information_schema.tables "
                              "WHERE table_name = 'feedback'") == [(0,)]  # fmt: skip
        assert httpx.post(link, data={"sig": sig}, timeout=10).status_code == 200
        # The server let go of the file again: this process can open it.
        with connect(url) as wh:
            assert wh.fetch("SELECT notification_id, verdict FROM feedback") == [
                (NOTIFICATION, "useful")
            ]

        # A second server on the same port: one line, non-zero exit.
        taken = run_cli("feedback-server", "--port", str(port), cwd=tmp_path, **env)
        assert taken.returncode == 1
        assert taken.stderr.strip().splitlines() == [
            f"changewatch: 127.0.0.1:{port}: Address already in use "
            "(another process is listening on it)"
        ]
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert SECRET not in out + err
