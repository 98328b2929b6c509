"""Polling settings in the watches file: the envelope's bounds, the stop conditions and the
sync sensors' tick, and each mistake named with file, line and key."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.watches_file import ConfigError, load_config
from changewatch.pipeline.triggers.fleet_assets import FLEET_SENSOR
from changewatch.pipeline.triggers.sync_sensors import SYNC_SENSOR


def source(name: str = "alpha", **settings: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "rest",
        "base_url": "http://127.0.0.1:9",
        "path": "/items",
        "table": name,
        "primary_key": "id",
        "columns": {"id": "bigint"},
        **settings,
    }


def load(tmp_path: Path, sources: list[dict], watches: list[dict] | None = None):
    path = tmp_path / "watches.yaml"
    data = {"version": 1, "sources": sources, "watches": watches or []}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path, lambda: load_config(path)


def test_envelope_and_stop_conditions_are_read(tmp_path: Path) -> None:
    settings = {
        "min_interval": "1m",
        "max_interval": "2h",
        "stop": {"until": "2030-06-30", "after_notifications": 5, "max_failures": 3},
    }
    watch = {"name": "w", "source": "alpha", "stop": {"until": "2030-01-01T12:00:00+02:00"}}
    _, read = load(tmp_path, [source(**settings)], [watch])
    config = read()
    alpha = config.source("alpha")
    assert (alpha.min_interval, alpha.max_interval) == (60.0, 7200.0)
    assert alpha.stop.active and alpha.stop.max_failures == 3
    # A day is polled through: the stop is at the start of the next day, UTC.
    assert alpha.stop.deadline() == datetime(2030, 7, 1, tzinfo=UTC).timestamp()
    assert config.watch("w").stop.deadline() == datetime(2030, 1, 1, 10, tzinfo=UTC).timestamp()
    assert not source_without_stop(tmp_path).stop.active


def source_without_stop(tmp_path: Path):
    _, read = load(tmp_path, [source()])
    return read().source("alpha")


@pytest.mark.parametrize(
    ("settings", "key", "why"),
    [
        ({"min_interval": "1m"}, "sources[0]", "set both min_interval and max_interval"),
        (
            {"min_interval": "2h", "max_interval": "1h"},
            "sources[0]",
            "min_interval (7200s) must be above 0 and at most max_interval (3600s)",
        ),
        (
            {"min_interval": "1m", "max_interval": "1h", "probe": False},
            "sources[0].min_interval",
            "adapts to what change probes see, and this source sends none",
        ),
        (
            {"stop": {"max_failures": 3}, "probe": False},
            "sources[0].stop.max_failures",
            "max_failures counts failed change probes",
        ),
        (
            {"stop": {"until": "2030-01-01"}, "cron": "0 * * * *"},
            "sources[0].stop",
            "this one is synced by a cron schedule",
        ),
        ({"stop": {"max_failures": 0}}, "sources[0].stop.max_failures", "greater than or equal"),
        ({"stop": {"until": "someday"}}, "sources[0].stop.until", "Input should be"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, settings: dict, key: str, why: str) -> None:
    path, read = load(tmp_path, [source(**settings)])
    with pytest.raises(ConfigError) as error:
        read()
    message = str(error.value)
    assert message.startswith(f"{path}:"), message
    assert f": {key}" in message and why in message, message


def test_a_watch_takes_no_max_failures(tmp_path: Path) -> None:
    watch = {"name": "w", "source": "alpha", "stop": {"max_failures": 2}}
    path, read = load(tmp_path, [source()], [watch])
    with pytest.raises(ConfigError, match=r"watches\[0\]\.stop\.max_failures: unknown key"):
        read()


# --- polling: tick, the sync sensors' least seconds between evaluations ---------------------


def with_polling(tmp_path: Path, polling: dict | None) -> Path:
    """A plain source and a fleet of two targets, with ``polling`` at the file's top level."""
    fleet = source("fleet", path="/items/{target}", for_each={"values": ["a", "b"]})
    path, _ = load(tmp_path, [source(), fleet])
    if polling is not None:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        path.write_text(yaml.safe_dump(data | {"polling": polling}), encoding="utf-8")
    return path


@pytest.mark.parametrize(("polling", "seconds"), [(None, 30), ({"tick": "2m"}, 120)])
def test_the_sync_sensors_tick_as_the_file_says(
    tmp_path: Path, polling: dict | None, seconds: int
) -> None:
    config = load_config(with_polling(tmp_path, polling))
    assert config.polling.tick == seconds
    sensors = build_definitions(config, environ={}).sensors or []
    ticks = {sensor.name: sensor.minimum_interval_seconds for sensor in sensors}
    assert ticks == {SYNC_SENSOR: seconds, FLEET_SENSOR: seconds}


@pytest.mark.parametrize(
    ("polling", "key", "why"),
    [
        ({"tick": "2s"}, "polling.tick", "greater than or equal to 5"),
        ({"tick": "2h"}, "polling.tick", "less than or equal to 3600"),
        ({"tick": "often"}, "polling.tick", "is not a duration"),
        ({"every": "1m"}, "polling.every", "unknown key"),
    ],
)
def test_a_bad_tick_is_named(tmp_path: Path, polling: dict, key: str, why: str) -> None:
    path = with_polling(tmp_path, polling)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}:"), message
    assert f": {key}" in message and why in message, message
