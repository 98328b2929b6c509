"""A channel's circuit in Dagster and the CLI: `channels_open` on `notifications` shows a
disabled channel with its 410, `changewatch resume --channel` opens it, and its queue goes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.channel_checks import CHANNELS_CHECK
from changewatch.pipeline.cli.command_line import main
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer
from cw_testing import demo_source_settings

COLUMNS = {"number": "bigint", "title": "text", "updated_at": "timestamp"}


class Receiver:
    """A webhook receiver on loopback that answers `status` and counts what it took."""

    def __init__(self) -> None:
        self.status = 410
        self.taken: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["content-length"]))
                if receiver.status == 200:
                    receiver.taken.append(self.headers["webhook-id"])
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()
    thread.join(timeout=5)


def deliver(path: Path) -> dg.AssetCheckEvaluation:
    defs = build_definitions(load_config(path))
    wanted = ("issues", "eval_closed", "notifications")
    assets = [a for a in defs.assets if a.key.to_user_string() in wanted]  # type: ignore[union-attr]
    with dg.instance_for_test() as instance:
        result = dg.materialize(assets, resources=defs.resources, instance=instance)
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == CHANNELS_CHECK]
    return check


def test_a_gone_receiver_disables_its_channel_until_resumed(
    tmp_path: Path,
    warehouse_url: str,
    demo_api: DemoAPIServer,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    path = tmp_path / "watches.yaml"
    watch = {"name": "closed", "source": "demo_issues", "where": "number <= 4"}
    config = {
        "sources": [demo_source_settings(demo_api.url, COLUMNS)],
        "channels": [{"name": "hook", "type": "webhook", "url": receiver.url}],
        "watches": [watch | {"channels": ["hook"]}],
    }
    path.write_text(yaml.safe_dump(config))

    check = deliver(path)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    line = check.metadata["hook"].value
    assert line.startswith("channel hook: disabled, the receiver answered ") and "410" in line
    assert "`changewatch resume --channel hook`" in line

    receiver.status = 200
    assert main(["--config", str(path), "resume", "--channel", "hook"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("channel hook: resumed (disabled since ")
    assert out.rstrip().endswith("HTTP 410 Gone); 4 waiting notification(s) are due now")
    assert main(["--config", str(path), "resume", "--channel", "nope"]) == 2
    assert "no channel 'nope' in the watches file (known: hook)" in capsys.readouterr().err

    check = deliver(path)
    assert check.passed and check.metadata["hook"].value == "channel hook: open"
    assert len(receiver.taken) == len(set(receiver.taken)) == 4
