"""`changewatch redeliver` against a real receiver, on DuckDB and Postgres: dead letters are
listed, then sent once each under their original ids; a disabled channel is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from changewatch.channels.config import WebhookChannelConfig
from changewatch.channels.outbox import deliver_due
from changewatch.channels.redeliver import ChannelDisabled, dead_letters, redeliver
from changewatch.pipeline.cli.command_line import main
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.warehouse import connect
from cw_testing import demo_source_settings
from queued import enqueue


def hook(receiver: Any) -> WebhookChannelConfig:
    return WebhookChannelConfig(name="hook", type="webhook", url=f"{receiver.url}/h")


def write_config(tmp_path: Path, receiver: Any) -> Path:
    source = demo_source_settings(
        "http://127.0.0.1:9", {"number": "bigint", "updated_at": "timestamp"}, name="src"
    )
    config = {
        "sources": [source],
        "channels": [{"name": "hook", "type": "webhook", "url": f"{receiver.url}/h"}],
        "watches": [{"name": "w", "source": "src", "where": "true", "channels": ["hook"]}],
    }
    path = tmp_path / "watches.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_dead_letters_go_again_once_under_their_ids(warehouse_url: str, http_receiver: Any) -> None:
    http_receiver.responses = [(400, {})] * 3  # permanent: all three dead at once
    with connect(warehouse_url) as wh:
        ids = enqueue(wh, ["hook"], [("a", 1), ("b", 2), ("a", 3)], at=datetime.now(UTC))
        deliver_due(wh, [hook(http_receiver)])
        dead = dead_letters(wh)
        assert dead.get_column("notification_id").to_list() == ids
        assert dead_letters(wh, channel="other").is_empty()
        assert dead_letters(wh, since=datetime.now(UTC) + timedelta(minutes=1)).is_empty()
        done = redeliver(wh, [hook(http_receiver)], dead)
        assert [i for i, _ in done.sent] == ids and done.failed == []
        # Once each: nothing is dead any more, so a second redeliver sends nothing.
        assert dead_letters(wh).is_empty()
        assert redeliver(wh, [hook(http_receiver)], dead).sent == []
    first, again = http_receiver.requests[:3], http_receiver.requests[3:]
    assert [r.headers["webhook-id"] for r in again] == [r.headers["webhook-id"] for r in first]
    assert [json.loads(r.body)["sequence"] for r in again] == [1, 2, 3]


def test_the_command_lists_first_and_refuses_a_disabled_channel(
    tmp_path: Path,
    warehouse_url: str,
    http_receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    path = write_config(tmp_path, http_receiver)
    http_receiver.responses = [(400, {}), (400, {}), (503, {})]
    with connect(warehouse_url) as wh:
        ids = enqueue(wh, ["hook"], [("a", 1), ("b", 2)], at=datetime.now(UTC))
        deliver_due(wh, [hook(http_receiver)])

    assert main(["--config", str(path), "redeliver", "--since", "2d", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 dead-lettered deliveries; would send:"
    assert [line.split()[0] for line in out[1:]] == ids and "HTTP 400" in out[1]
    assert len(http_receiver.requests) == 2

    # The first fails again (503) and stays dead: exit 1, saying which.
    assert main(["--config", str(path), "redeliver", "--watch", "w"]) == 1
    out = capsys.readouterr().out
    assert "redelivered 1 of 2" in out and f"{ids[0]}: failed again, still dead-lettered" in out

    assert main(["--config", str(path), "redeliver", "--since", "soon"]) == 2
    assert "--since: 'soon' is not a duration" in capsys.readouterr().err
    assert main(["--config", str(path), "redeliver", "--channel", "nope"]) == 2
    assert "no channel 'nope' in the watches file (known: hook)" in capsys.readouterr().err

    http_receiver.responses = [(410, {})]
    with connect(warehouse_url) as wh:
        enqueue(wh, ["hook"], [("c", 3)], at=datetime.now(UTC))
        deliver_due(wh, [hook(http_receiver)])
        with pytest.raises(ChannelDisabled):
            redeliver(wh, [hook(http_receiver)], dead_letters(wh))
    assert main(["--config", str(path), "redeliver"]) == 2
    err = capsys.readouterr().err
    assert "channel hook: disabled" in err and "changewatch resume --channel hook" in err
