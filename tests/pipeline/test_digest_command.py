"""`changewatch digest`: whole days once they have ended, `--partial` for the day so far, and
the days a digest's partitions cover."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml
from changewatch.channels.config import DigestConfig
from changewatch.pipeline.assets.watch_assets import digest_partitions
from changewatch.pipeline.project.watches_file import load_config
from changewatch.warehouse import connect
from cw_testing import demo_source_settings
from dagster import DagsterInstance, DagsterRunStatus
from test_cli import run_cli

# Minutes of subprocesses: started first (see tests/conftest.py).
pytestmark = pytest.mark.heavy


def test_digest_days_start_from_the_config_and_end_with_yesterday(tmp_path: Path) -> None:
    zone = "Pacific/Auckland"  # far from UTC: "today" is the digest's own
    today = datetime.now(ZoneInfo(zone)).date()
    settings = {"name": "daily", "watches": ["w"], "output_dir": "out", "timezone": zone}
    dated = digest_partitions(DigestConfig(**settings, start=date(2026, 3, 1)))
    keys = dated.get_partition_keys()
    assert keys[0] == "2026-03-01"
    # Only days that have ended: today's digest is not a partition yet.
    assert keys[-1] == (today - timedelta(days=1)).isoformat()
    # Without `start:`, a week back.
    default = digest_partitions(DigestConfig(**settings)).get_partition_keys()
    assert default[0] == (today - timedelta(days=7)).isoformat()
    assert default[-1] == keys[-1]


def test_start_is_read_from_the_watches_file(tmp_path: Path) -> None:
    columns = {"number": "bigint", "updated_at": "timestamp"}
    source = demo_source_settings("http://127.0.0.1:1", columns)
    data = {
        "sources": [source],
        "watches": [{"name": "w", "source": "demo_issues", "heading": "Everything"}],
        "digests": [{"name": "d", "watches": ["w"], "output_dir": "out", "start": "2026-02-03"}],
    }
    path = tmp_path / "watches.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    config = load_config(path)
    [digest] = config.digests
    assert digest.start == date(2026, 2, 3)
    assert digest_partitions(digest).get_first_partition_key() == "2026-02-03"
    assert config.headings(digest) == {"w": "Everything"}


def test_a_day_by_hand_is_the_window_of_its_partition() -> None:
    from changewatch.pipeline.cli.digest_command import day_window

    digest = DigestConfig(
        name="d", watches=["w"], output_dir="out", timezone="Europe/Berlin", start=date(2026, 3, 1)
    )
    partitions = digest_partitions(digest)
    for day in ("2026-03-28", "2026-03-29", "2026-10-25"):  # DST starts on the 29th
        window = partitions.time_window_for_partition_key(day)
        assert day_window(digest, date.fromisoformat(day)) == (window.start, window.end)


@pytest.mark.e2e  # five `changewatch` processes in a row, per backend (90-112 s under load)
def test_today_is_refused_whole_and_sent_so_far_with_partial(
    warehouse_url: str, demo_api, tmp_path: Path
) -> None:
    columns = {
        "number": "bigint",
        "title": "text",
        "labels": {"type": "text[]", "path": "labels[].name"},
        "html_url": "text",
        "updated_at": "timestamp",
    }
    data = {
        "sources": [demo_source_settings(demo_api.url, columns)],
        "watches": [
            {
                "name": "new_bugs",
                "source": "demo_issues",
                "where": "'bug' IN labels",
                "heading": "Bugs opened",
                "title": "New bug #{{ key }}",
                "body": "Reported as: {{ new.title }}",
            },
            {"name": "first_issues", "source": "demo_issues", "where": "number <= 3"},
        ],
        "digests": [
            {"name": "daily", "watches": ["new_bugs", "first_issues"], "output_dir": "digests"}
        ],
    }
    (tmp_path / "watches.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {"CHANGEWATCH_WAREHOUSE_URL": warehouse_url, "DAGSTER_HOME": str(tmp_path)}
    synced = run_cli("sync", cwd=tmp_path, **env)
    assert synced.returncode == 0, synced.stderr
    with connect(warehouse_url) as wh:
        [(notified,)] = wh.fetch("SELECT count(*) FROM outbox")
        [(first,)] = wh.fetch("SELECT min(created_at) FROM outbox")
    bugs = [i for i in demo_api.tracker.snapshot() if "bug" in {x["name"] for x in i["labels"]}]
    assert notified == len(bugs) + 3
    today = first.astimezone(UTC).date().isoformat()

    refused = run_cli("digest", "daily", "--day", today, cwd=tmp_path, **env)
    assert refused.returncode == 1
    assert f"digest 'daily': {today} is not over until" in refused.stderr
    assert "--partial sends the items so far" in refused.stderr

    partial = run_cli("digest", "daily", "--day", today, "--partial", cwd=tmp_path, **env)
    assert partial.returncode == 0, partial.stderr
    prefix = "digest_daily: written so far (partial: the day stays open), "
    assert partial.stdout.startswith(f"{prefix}{notified} item(s) -> "), partial.stdout
    files = partial.stdout.strip().split(" -> ")[1].split(", ")
    [eml] = [Path(f) for f in files if f.endswith(".partial.eml")]
    message = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
    assert message["Subject"].startswith(f"changewatch daily digest for {today}: ")
    assert message["Subject"].endswith("change(s) (so far)")
    text = message.get_body(preferencelist=("plain",)).get_content()
    assert "Bugs opened (" in text and "First issues (3 changes)" in text
    assert f"Reported as: {bugs[0]['title']}" in text
    # Without --day, --partial means today (not yesterday, which has ended).
    so_far = run_cli("digest", "daily", "--partial", cwd=tmp_path, **env)
    assert so_far.returncode == 0, so_far.stderr
    assert so_far.stdout.startswith(f"{prefix}{notified} item(s) -> "), so_far.stdout
    with connect(warehouse_url) as wh:
        # Nothing recorded: the day's whole digest is still to come.
        assert wh.fetch("SELECT count(*) FROM digests") == [(0,)]

    # A day that has ended goes through Dagster (yesterday: nothing in it).
    yesterday = run_cli("digest", "daily", cwd=tmp_path, **env)
    assert yesterday.returncode == 0, yesterday.stderr
    assert yesterday.stdout == "digest_daily: empty, 0 item(s)\n"
    # Under the digest's own job, the one its schedule runs, not an ad hoc asset job.
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        runs = {run.job_name: run for run in instance.get_runs()}
    assert set(runs) == {"sync_sources", "digest_daily_job"}
    assert runs["digest_daily_job"].status == DagsterRunStatus.SUCCESS
    day = date.fromisoformat(runs["digest_daily_job"].tags["dagster/partition"])
    assert day in {datetime.now(UTC).date() - timedelta(days=n) for n in (1, 2)}  # past midnight
    early = run_cli("digest", "daily", "--day", "2020-01-01", cwd=tmp_path, **env)
    assert early.returncode == 1 and "set `start:`" in early.stderr


def test_partial_of_a_day_that_has_ended_is_refused_in_one_line(tmp_path: Path) -> None:
    source = demo_source_settings(
        "http://127.0.0.1:1", {"number": "bigint", "updated_at": "timestamp"}
    )
    data = {
        "sources": [source],
        "watches": [{"name": "w", "source": "demo_issues"}],
        "digests": [{"name": "daily", "watches": ["w"], "output_dir": "out"}],
    }
    (tmp_path / "watches.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {"CHANGEWATCH_WAREHOUSE_URL": f"duckdb:///{tmp_path / 'w.duckdb'}"}
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    refused = run_cli("digest", "daily", "--partial", "--day", yesterday, cwd=tmp_path, **env)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr == (
        f"changewatch: digest 'daily': {yesterday} ended at {datetime.now(UTC).date()} 00:00 "
        "(UTC), so --partial (the day so far) does not apply; without --partial it is sent "
        "whole\n"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "w.duckdb").exists()
