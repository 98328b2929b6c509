"""The watches file's `delivery:` block: the claim lease, its default and its checks."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from changewatch.channels.outbox import DeliveryPolicy
from changewatch.pipeline.project.watches_file import ConfigError, load_config

HOOK = """
channels:
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/changewatch
    timeout: 10
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "watches.yaml"
    path.write_text(text)
    return path


def test_the_lease_defaults_to_ten_minutes_and_is_set_by_the_watches_file(
    tmp_path: Path,
) -> None:
    assert DeliveryPolicy.from_config(load_config(write(tmp_path, HOOK)).delivery).lease == (
        timedelta(minutes=10)
    )
    config = load_config(write(tmp_path, HOOK + "delivery:\n  lease: 90s\n"))
    assert DeliveryPolicy.from_config(config.delivery).lease == timedelta(seconds=90)


def test_a_lease_a_send_could_outlast_is_refused_naming_the_channel(tmp_path: Path) -> None:
    path = write(tmp_path, HOOK + "delivery:\n  lease: 15s\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert f"{path}:8: delivery.lease" in message
    assert "twice the timeout of channel 'hook' (10s)" in message
    assert "raise delivery.lease or lower the timeout" in message


def test_a_lease_must_be_a_positive_duration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="delivery.lease"):
        load_config(write(tmp_path, HOOK + "delivery:\n  lease: 0\n"))
