"""`changewatch webhooks` in its own process: it stores a signed delivery before answering,
says what it received in its output (never the secret), and a missing secret is one line."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from cw_testing import demo_source_settings
from test_cli import run_cli

SECRET = "cli-webhook-s3cret"
BODY = b'{"action": "closed", "issue": {"number": 3}}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_webhooks_from_the_command_line(tmp_path: Path) -> None:
    hook = {"path": "/hooks/issues", "secret_env": "CW_TEST_HOOK_SECRET", "provider": "github"}
    source = demo_source_settings(
        "http://127.0.0.1:9", {"number": "bigint", "updated_at": "timestamp"}, webhook=hook
    )
    config = {"version": 1, "sources": [source]}
    (tmp_path / "watches.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")

    missing = run_cli("webhooks", "--port", "0", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "changewatch: source 'demo_issues': webhook.secret_env: environment variable "
        "CW_TEST_HOOK_SECRET is not set"
    ]

    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CHANGEWATCH_")}
    environ |= {"CW_TEST_HOOK_SECRET": SECRET, "CHANGEWATCH_WEBHOOK_INBOX": "in.sqlite"}
    server = subprocess.Popen(
        [sys.executable, "-m", "changewatch.pipeline.cli", "webhooks", "--port", str(port)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith(f"receiving webhooks on http://127.0.0.1:{port} ("), first
        assert "demo_issues at /hooks/issues" in first and str(tmp_path / "in.sqlite") in first
        mac = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
        headers = {"X-Hub-Signature-256": f"sha256={mac}", "X-GitHub-Delivery": "gh-77"}
        url = f"http://127.0.0.1:{port}/hooks/issues"
        answer = httpx.post(url, content=BODY, headers=headers, timeout=30)
        assert answer.status_code == 202
        # Stored before the answer: the file holds it now.
        with sqlite3.connect(tmp_path / "in.sqlite") as con:
            rows = con.execute("SELECT source, delivery_id, body FROM webhook_inbox").fetchall()
        assert rows == [("demo_issues", "gh-77", BODY)]
        bad = {"X-Hub-Signature-256": "sha256=" + "0" * 64, "X-GitHub-Delivery": "gh-78"}
        forged = httpx.post(url, content=BODY, headers=bad, timeout=30)
        assert forged.status_code == 401
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "delivery gh-77 stored" in out
    assert "webhook for demo_issues refused: the signature does not match" in out
    assert SECRET not in out + err and mac not in out + err
