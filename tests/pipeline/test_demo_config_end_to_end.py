"""The bundled demo config, end to end through Dagster, on DuckDB and on Postgres, with its
judge pointed at an OpenAI-compatible server on loopback (speaking the real wire format)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from changewatch.pipeline.cli.in_process_runs import materialize, source_job_assets
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from cw_testing import REPO
from openai_server import FakeOpenAIServer, label_judge
from patience import run

security_model = label_judge("security")


@pytest.fixture
def llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(respond=security_model) as server:
        yield server


def labelled(api: DemoAPIServer, label: str, numbers: list[int] | None = None) -> set[int]:
    issues = api.tracker.snapshot()
    return {
        i["number"]
        for i in issues
        if {"name": label} in i["labels"] and (numbers is None or i["number"] in numbers)
    }


@pytest.fixture
def demo_run(
    warehouse_url: str,
    demo_env: DemoAPIServer,
    llm: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> DemoAPIServer:
    """The demo config's environment: its API, the warehouse under test, the loopback LLM."""
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    monkeypatch.setenv("CHANGEWATCH_LLM_BASE_URL", llm.base_url)
    return demo_env


def test_demo_config_first_second_and_changed_runs(
    warehouse_url: str, demo_run: DemoAPIServer, llm: FakeOpenAIServer
) -> None:
    config = load_config()
    assets = source_job_assets(config, ["demo_issues"])

    def run() -> dict[str, dict]:
        with dg.instance_for_test() as instance:
            return materialize(config, assets, instance)

    first = run()
    bugs, security = labelled(demo_run, "bug"), labelled(demo_run, "security")
    assert first["eval_new_bugs"]["notified"] == len(bugs)
    assert first["eval_closed_issues"]["notified"] == 0  # nothing closed yet
    assert first["eval_security_review"]["judged"] == 40 == len(llm.requests)
    assert first["eval_security_review"]["notified"] == len(security)
    assert first["notifications"]["sent"] == 2 * (len(bugs) + len(security))  # two channels

    second = run()
    for watch in ("new_bugs", "closed_issues", "security_review"):
        assert second[f"eval_{watch}"]["changes_read"] == 0
        assert second[f"eval_{watch}"]["notified"] == 0
    assert second["eval_security_review"]["judged"] == 0 and len(llm.requests) == 40
    assert second["notifications"]["sent"] == 0

    mutation = demo_run.tracker.mutate(update=4, create=3, delete=1)
    third = run()
    k = len(mutation["updated"]) + len(mutation["created"]) + len(mutation["deleted"])
    for watch in ("new_bugs", "closed_issues", "security_review"):
        assert third[f"eval_{watch}"]["changes_read"] == k
    with connect(warehouse_url) as wh:
        passing = wh.fetch(
            "SELECT count(*) FROM evaluations WHERE watch = 'security_review' "
            "AND passed_filter AND change_id > 40"
        )[0][0]
    # Only the changes that passed the filter went to the model.
    assert third["eval_security_review"]["judged"] == passing == len(llm.requests) - 40
    new_bugs = labelled(demo_run, "bug", mutation["created"])
    assert third["eval_new_bugs"]["notified"] == len(new_bugs)
    lines = Path(os.environ["CHANGEWATCH_CONFIG"]).parent / ".changewatch" / "notifications.jsonl"
    sent = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(sent) == len({(n["notification_id"]) for n in sent})  # never twice


def test_definitions_validate_on_the_example_config(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = dict(
        os.environ,
        DAGSTER_HOME=str(tmp_path),
        CHANGEWATCH_CONFIG=str(REPO / "examples" / "github.yaml"),
        GITHUB_TOKEN="unused",
        OPENAI_API_KEY="unused",
        SMTP_PASSWORD="unused",
        WEBHOOK_SECRET="unused",
    )
    done = run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_filter_failing_on_some_changes_fails_no_run(demo_run: DemoAPIServer) -> None:
    import yaml

    path = Path(os.environ["CHANGEWATCH_CONFIG"])
    settings = yaml.safe_load(path.read_text())
    # Loads fine; fails at run time on issues 3 and 17, whose titles are no numbers.
    settings["watches"].append(
        {
            "name": "odd",
            "source": "demo_issues",
            "where": "CASE WHEN number IN (3, 17) THEN CAST(title AS integer) > 0 ELSE FALSE END",
            "channels": ["console"],
        }
    )
    path.write_text(yaml.safe_dump(settings))
    config = load_config()
    with dg.instance_for_test() as instance:
        result = materialize(config, source_job_assets(config, ["demo_issues"]), instance)
    # The run succeeds: the other watches notify and delivery runs after them.
    assert result["eval_odd"]["filter_errors"] == 2
    assert result["eval_new_bugs"]["notified"] == len(labelled(demo_run, "bug"))
    assert result["notifications"]["sent"] >= len(labelled(demo_run, "bug"))
