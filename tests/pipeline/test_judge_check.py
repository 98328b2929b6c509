"""An unreachable judge shows in Dagster (a failing WARN check) and in the CLI summary."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.watch_assets import HELD_CHECK, JUDGE_CHECK
from changewatch.pipeline.cli.command_line import summarize
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from cw_testing import demo_source_settings
from openai_server import FakeOpenAIServer, label_judge
from test_cli import run_cli

COLUMNS = {
    "number": "bigint",
    "title": "text",
    "labels": {"type": "text[]", "path": "labels[].name"},
    "updated_at": "timestamp",
}


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A model server address that refuses connections: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def write_config(tmp_path: Path, api: DemoAPIServer, llm_url: str, **judge: object) -> Path:
    watch = {
        "name": "review",
        "source": "demo_issues",
        "where": "kind = 'insert'",
        "judge": {
            "condition": "The issue is about security.",
            "model": "test-model",
            "base_url": llm_url,
            "max_retries": 0,
            "timeout": 5,
            **judge,
        },
    }
    path = tmp_path / "watches.yaml"
    source = demo_source_settings(api.url, COLUMNS)
    path.write_text(yaml.safe_dump({"sources": [source], "watches": [watch]}))
    return path


def evaluate(path: Path, check_name: str = JUDGE_CHECK) -> tuple[dict, dg.AssetCheckEvaluation]:
    defs = build_definitions(load_config(path))
    assets = [a for a in defs.assets if a.key.to_user_string() in ("issues", "eval_review")]  # type: ignore[union-attr]
    with dg.instance_for_test() as instance:
        result = dg.materialize(assets, resources=defs.resources, instance=instance)
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == check_name]
    [meta] = [
        {k: v.value for k, v in e.step_materialization_data.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() == "eval_review"
    ]
    return meta, check


def test_an_unreachable_judge_fails_the_judge_check_until_it_answers(
    tmp_path: Path,
    warehouse_url: str,
    demo_api: DemoAPIServer,
    closed_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    meta, check = evaluate(write_config(tmp_path, demo_api, closed_url))
    # Three calls failed (then the breaker held the rest): none of them is a judgement.
    assert (meta["judged"], meta["judge_errors"], meta["held"]) == (0, 3, 40)
    assert meta["judge_unavailable"] == f"unreachable at {closed_url}"
    assert check.check_name == JUDGE_CHECK
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.description == f"judge unreachable at {closed_url}: 40 held"

    with FakeOpenAIServer(respond=label_judge("security")) as llm:
        meta, check = evaluate(write_config(tmp_path, demo_api, llm.base_url))
    assert (meta["judged"], meta["held"], meta["judge_unavailable"]) == (40, 0, "")
    assert check.passed


def test_the_cli_summary_says_the_judge_is_unreachable(
    tmp_path: Path, warehouse_url: str, demo_api: DemoAPIServer, closed_url: str
) -> None:
    path = write_config(tmp_path, demo_api, closed_url)
    done = run_cli(
        "sync", cwd=tmp_path, CHANGEWATCH_CONFIG=str(path), CHANGEWATCH_WAREHOUSE_URL=warehouse_url
    )
    assert done.returncode == 0, done.stderr
    assert (
        "eval_review: 40 change(s) read, 40 passed the filter, 0 judged (0 cached), 0 notified, "
        f"0 duplicate(s), 40 held; judge unreachable at {closed_url}: 40 held\n"
    ) in done.stdout


def test_a_daily_budget_holds_the_rest_and_the_spend_is_metadata(
    tmp_path: Path, warehouse_url: str, demo_api: DemoAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    budget = {"max_calls_per_day": 15, "price_per_mtok_input": 0.15, "price_per_mtok_output": 0.6}
    with FakeOpenAIServer(respond=label_judge("security")) as llm:
        path = write_config(tmp_path, demo_api, llm.base_url, **budget)
        meta, check = evaluate(path, HELD_CHECK)
        # Each answer costs 100 prompt and 20 completion tokens (the fake server's usage).
        assert (meta["judged"], meta["judge_calls"], meta["held"]) == (15, 15, 25)
        assert meta["judge_requests"] == 15
        assert meta["judge_cost_usd"] == pytest.approx(15 * (100 * 0.15 + 20 * 0.6) / 1e6)
        assert (
            not check.passed and check.description == "25 change(s) held, 0 failed the filter's run"
        )
        with connect(warehouse_url) as wh:
            reasons = wh.fetch(
                "SELECT DISTINCT judge_error FROM evaluations WHERE decision = 'held'"
            )
            spend = wh.fetch("SELECT calls, prompt_tokens, completion_tokens FROM judge_spend")
        assert reasons == [("daily judge budget of 15 calls reached",)]
        assert spend == [(15, 1500, 300)]
        # The CLI's summary of the run says so, not only the SQL.
        assert summarize("eval_review", meta).endswith(
            "25 held; daily budget of 15 calls reached: 25 held until tomorrow"
        )

        # The same day: the budget is spent, the model is not asked, nothing is dropped.
        asked = len(llm.requests)
        meta, check = evaluate(path, HELD_CHECK)
        assert (meta["judged"], meta["held"], len(llm.requests)) == (0, 25, asked)

        # A bigger budget settles the rest; the check passes again.
        path = write_config(tmp_path, demo_api, llm.base_url, max_calls_per_day=100)
        meta, check = evaluate(path, HELD_CHECK)
    assert (meta["judged"], meta["held"]) == (25, 0)
    assert "judge_cost_usd" not in meta  # no price configured
    assert check.passed and check.description == "nothing waits"
    assert "daily budget" not in summarize("eval_review", meta)
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT calls FROM judge_spend") == [(40,)]
