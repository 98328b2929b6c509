"""`changewatch eval` over the labelled set in evals/: the report, its results file, a server
that is down, and a run stopped half-way, against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from changewatch.pipeline.cli.command_line import main
from cw_testing import REPO
from openai_server import FakeOpenAIServer, Reply, Request
from patience import reaped, wait_working
from test_cli import run_cli


def keyword_model(request: Request) -> Reply:
    """A stand-in model that notifies when the change (not the prompt around it) mentions a
    failure: right about some examples, wrong about others, as a model is."""
    change = request.messages[-1]["content"]
    notify = any(word in change for word in ("fail", "CVE", "out of stock", "down"))
    return Reply.verdict(
        {
            "reasoning": "It mentions a failure." if notify else "Nothing failed.",
            "should_notify": notify,
            "urgency": "high" if notify else "low",
            "summary": "Something happened.",
            "confidence": 0.8,
        },
        prompt_tokens=700,
        completion_tokens=60,
    )


def row(report: str, condition: str) -> list[str]:
    """The cells of a condition's row in a text report."""
    (line,) = [line for line in report.splitlines() if line.split()[:1] == [condition]]
    return line.split()


def test_the_labelled_set_is_scored_per_condition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results.jsonl"
    with FakeOpenAIServer(respond=keyword_model) as llm:
        args = ["--config", str(REPO / "watches.yaml"), "eval", "--model", "kw"]
        args += ["--base-url", llm.base_url, "--split", "tune", "--results", str(results)]
        code = main([*args, "--format", "json"])
        asked = len(llm.requests)
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    # The held-out examples stay out of a tuning run: 14 of each condition's 40.
    assert asked == 56 and len(results.read_text().splitlines()) == 56
    assert {name: s["examples"] for name, s in out["examples"].items()} == {
        "incidents": 14,
        "prices": 14,
        "releases": 14,
        "status_pages": 14,
    }
    assert out["examples"]["prices"]["condition"].startswith("A product's price dropped")
    (model,) = out["models"]
    assert (model["model"], model["endpoint"]) == ("kw", llm.base_url)
    assert list(model["conditions"]) == ["incidents", "prices", "releases", "status_pages", "all"]
    overall = model["conditions"]["all"]
    matrix = overall["confusion"]
    assert sum(matrix["notify"].values()) == sum(matrix["skip"].values()) == 28
    assert overall["examples"] == 56 and (overall["unanswered"], overall["invalid"]) == (0, 0)
    assert overall["tokens"] == {"prompt": 56 * 700, "completion": 56 * 60}
    tp, fp, fn = matrix["notify"]["notify"], matrix["skip"]["notify"], matrix["notify"]["skip"]
    assert overall["precision"] == round(tp / (tp + fp), 4)
    assert overall["recall"] == round(tp / (tp + fn), 4)
    assert 0 < overall["latency_ms"]["p50"] <= overall["latency_ms"]["p95"]
    # Each condition's own counts add up to the model's.
    per_condition = [m for name, m in model["conditions"].items() if name != "all"]
    assert sum(m["confusion"]["skip"]["notify"] for m in per_condition) == fp
    assert len(model["misses"]) == 56 - tp - matrix["skip"]["skip"]
    assert out["problems"] == []


def test_a_server_that_is_down_fails_the_eval_in_lines_not_a_traceback(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    done = run_cli(
        "eval", "--model", "gone", "--base-url", "http://127.0.0.1:9/v1",
        "--results", str(results), cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "changewatch: model 'gone' at http://127.0.0.1:9/v1: stopped after 3 failures of its "
        "server in a row (could not connect to the model server (after 3 attempts)); the rest "
        "was not asked",
        "changewatch: model 'gone' at http://127.0.0.1:9/v1 never answered (3 example(s)): "
        "could not connect to the model server (after 3 attempts)",
    ]
    # What it tried is in the report and the results file.
    assert row(done.stdout, "incidents")[:7] == ["incidents", "3", "-", "0.00", "-", "3", "0"]
    assert [json.loads(line)["answer"] for line in results.read_text().splitlines()] == [
        "unanswered"
    ] * 3


@pytest.mark.e2e  # a kill test: SIGINT to a running `changewatch eval`, then a second process
def test_a_stopped_run_keeps_its_results_and_resume_carries_on(tmp_path: Path) -> None:
    examples = [
        {"name": f"outage {i}", "kind": "insert", "new": {"title": f"API down {i}"}}
        | {"expect": "notify" if i % 2 else "skip"}
        for i in range(8)
    ]
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "outages.yaml").write_text(
        yaml.safe_dump({"condition": "The API is down.", "examples": examples})
    )
    results = tmp_path / "results.jsonl"

    def lines() -> int:
        return len(results.read_text().splitlines()) if results.exists() else 0

    slow = lambda request: keyword_model(request).__class__(  # noqa: E731
        content=keyword_model(request).content, delay=0.3
    )
    with FakeOpenAIServer(respond=slow) as llm:
        command = [sys.executable, "-m", "changewatch.pipeline.cli", "eval", "--model", "kw"]
        command += ["--base-url", llm.base_url, "--results", str(results)]
        with reaped([]) as procs:
            procs.append(
                subprocess.Popen(
                    command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
            proc = procs[0]
            wait_working(lambda: lines() >= 2, pids=lambda: [proc.pid], what="two results")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate()
        assert proc.returncode == 130, err
        kept = lines()
        assert 2 <= kept < 8
        assert f"changewatch: interrupted; {kept} result(s) kept in {results}" in err
        assert row(out, "outages")[:2] == ["outages", str(kept)]  # the report of what it did
        asked = len(llm.requests)

        done = run_cli("eval", "--model", "kw", "--base-url", llm.base_url,
                       "--results", str(results), "--resume", cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        # Only what the results lacked was asked (the interrupted request's too).
        assert len(llm.requests) - asked == 8 - kept
    assert lines() == 8
    assert row(done.stdout, "outages")[:2] == ["outages", "8"]


def test_what_eval_needs_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(tmp_path / "watches.yaml")]
    assert main([*config, "eval"]) == 2
    assert capsys.readouterr().err == (
        "changewatch: name a model to score (--model NAME, or --model local), or a watch "
        "whose judge to score\n"
    )
    (tmp_path / "evals").mkdir()
    bare = tmp_path / "evals" / "bare.yaml"
    bare.write_text(yaml.safe_dump({"examples": [{"new": {"title": "x"}, "expect": "skip"}]}))
    assert main([*config, "eval", "--model", "m"]) == 1
    assert capsys.readouterr().err == (
        f"changewatch: {bare}: names no condition to judge its examples by (condition: ...); "
        "name a watch to use its judge's\n"
    )
    assert main([*config, "eval", "--model", "m", "--split", "test", "--examples", str(bare)]) == 1
    assert capsys.readouterr().err == f"changewatch: {bare}: no examples with split: test\n"
