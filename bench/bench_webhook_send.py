"""CPU of one webhook notification's send, with the process's TLS context against a client's
own, side by side in one run (issue 31: what a changed source costs a run).

``WebhookChannel.send`` makes an httpx client per send (a new connection each time, so a
receiver that closed an idle one never costs a failed attempt). Until the fifth session of
2026-11-29 each such client built its own TLS context, loading certifi's CA bundle, even for
an ``http://`` URL. Now the channel passes the process's context (sources/http.py
``tls_context``). Both ways are timed here, alternating, against a loopback receiver: the
channel as it is, and the same POST from a client made as the channel made it before.

Run from the repository root::

    .venv/bin/python bench/bench_webhook_send.py            # 200 sends each way, 3 rounds
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from changewatch.channels.base import Notification
from changewatch.channels.config import WebhookChannelConfig
from changewatch.channels.webhook import WebhookChannel


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _notification(i: int) -> Notification:
    return Notification(
        notification_id=f"ntf_{i}",
        watch="bench",
        source="bench",
        object_key=str(i),
        kind="update",
        title=f"Change #{i}",
        body="",
        url=None,
        urgency="normal",
        summary=None,
        created_at=datetime(2026, 11, 29, tzinfo=UTC),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    channel = WebhookChannel(WebhookChannelConfig(name="bench", type="webhook", url=url))

    def shared_context(i: int) -> None:
        channel.send(_notification(i))

    def own_context(i: int) -> None:  # the channel's client before: httpx's default verify
        body = _notification(i).to_json_bytes()
        with httpx.Client(timeout=channel.config.timeout, follow_redirects=False) as client:
            client.post(url, content=body, headers={"content-type": "application/json"})

    ways = {
        "the process's TLS context (now)": shared_context,
        "a client's own (before)": own_context,
    }
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, send in ways.items():
            start = time.process_time()
            for i in range(args.sends):
                send(i)
            cpu[name].append((time.process_time() - start) / args.sends)
    server.shutdown()
    print(f"bench_webhook_send: {args.sends} sends each way, {args.rounds} rounds (medians; "
          "CPU of this process, the receiver's thread included)")  # fmt: skip
    for name, values in cpu.items():
        print(f"{name:<32} {1000 * statistics.median(values):6.2f} ms of CPU per notification")
    now, before = (statistics.median(v) for v in cpu.values())
    print(f"before / now: {before / now:.1f}x")


if __name__ == "__main__":
    main()
