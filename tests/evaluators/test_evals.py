"""The eval harness and feedback: real judge calls over a loopback OpenAI-compatible server,
results written to a real file and scored from it, feedback stored in real warehouses and
exported as examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from changewatch.evaluators.config import Watch
from changewatch.evaluators.eval_report import format_report, never_answered, report
from changewatch.evaluators.eval_results import ResultsWriter, read_results
from changewatch.evaluators.eval_run import STOP_AFTER, EvalSet, run_eval
from changewatch.evaluators.evals import EvalError, load_examples
from changewatch.evaluators.feedback import (
    FeedbackError,
    examples_yaml,
    export_examples,
    record_feedback,
)
from changewatch.evaluators.judge import Judge
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from openai_server import FakeOpenAIServer, Reply, Request, label_judge
from test_evaluate import demo_config, evaluate, judged_watch

EXAMPLES = """\
examples:
  - name: token leak
    old: {title: Login page, labels: [bug]}
    new: {title: Login page, labels: [bug, security]}
    expect: notify
  - name: new security issue
    kind: insert
    new: {title: XSS in search, labels: [security]}
    expect: notify
  - name: typo
    old: {title: Tpyo, labels: [docs]}
    new: {title: Typo, labels: [docs]}
    expect: skip
  - name: feature
    kind: insert
    new: {title: Dark mode, labels: [feature]}
    expect: skip
"""

sharp = label_judge("security")
SKIP = {
    "reasoning": "Not about security.",
    "should_notify": False,
    "urgency": "low",
    "summary": "A feature.",
    "confidence": 0.9,
}


def two_models(request: Request) -> Reply:
    """`sharp` notifies on the security label only; `eager` notifies on everything."""
    if request.body.get("model") == "sharp":
        return sharp(request)
    return Reply.verdict(
        {
            "reasoning": "Everything matters.",
            "should_notify": True,
            "urgency": "high",
            "summary": "Something changed.",
            "confidence": 0.8,
        },
        prompt_tokens=200,
        completion_tokens=30,
    )


def watch(base_url: str, **judge: Any) -> Watch:
    return Watch.model_validate(
        {
            "name": "leaks",
            "sources": ["issues"],
            "judge": {
                "condition": "The issue is about a security problem.",
                "model": "sharp",
                "base_url": base_url,
                "max_retries": 0,
                "timeout": 5,
                **judge,
            },
        }
    )


@pytest.fixture
def examples(tmp_path: Path):
    path = tmp_path / "evals" / "security.yaml"
    path.parent.mkdir()
    path.write_text(EXAMPLES)
    return load_examples(path)


def run(w: Watch, examples, results: Path, *models: str | None, **options: Any):
    """Judge ``examples`` with ``w``'s judge per model, then read back and score the results."""
    eval_set = EvalSet(name="security", watch=w.name, judge=w.judge, examples=examples)
    with ResultsWriter(results, resume=options.pop("resume", False)) as writer:
        stopped = run_eval([eval_set], list(models) or [None], writer, **options)
    written = read_results(results)
    return stopped, written, report(written)


def test_scores_each_model_per_condition_from_its_results(examples, tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    with FakeOpenAIServer(respond=two_models) as llm:
        stopped, written, models = run(watch(llm.base_url), examples, results, "sharp", "eager")
        asked = [r.body["model"] for r in llm.requests]
    assert asked == ["sharp"] * 4 + ["eager"] * 4 and stopped == []
    # One line per judgement, as it was judged.
    assert len(results.read_text().splitlines()) == 8
    assert [(r.model, r.example, r.got) for r in written[:4]] == [
        ("sharp", "token leak", "notify"),
        ("sharp", "new security issue", "notify"),
        ("sharp", "typo", "skip"),
        ("sharp", "feature", "skip"),
    ]
    assert {r.endpoint for r in written} == {llm.base_url}

    sharp, eager = models
    assert list(sharp["conditions"]) == ["security", "all"]
    perfect = sharp["conditions"]["all"]
    assert (perfect["precision"], perfect["recall"], perfect["f1"]) == (1.0, 1.0, 1.0)
    assert (perfect["calls"], perfect["tokens"]) == (4, {"prompt": 400, "completion": 80})
    assert sharp["misses"] == []
    # Eager flags all four: half of its notifications were wanted, and it missed none.
    flagged = eager["conditions"]["security"]
    assert (flagged["precision"], flagged["recall"], flagged["f1"]) == (0.5, 1.0, 0.6667)
    assert flagged["confusion"] == {
        "notify": {"notify": 2, "skip": 0, "none": 0},
        "skip": {"notify": 2, "skip": 0, "none": 0},
    }
    assert flagged["tokens"] == {"prompt": 800, "completion": 120}
    latency = flagged["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"]
    assert [m.split(": ")[1] for m in eager["misses"]] == ["typo", "feature"]

    text = format_report(models).splitlines()
    assert text[0] == f"model sharp at {llm.base_url}"
    assert text[2].split()[:7] == ["security", "4", "1.00", "1.00", "1.00", "0", "0"]
    assert any(line.startswith("  security: typo: expected skip, got notify") for line in text)


def test_min_confidence_applies_as_in_evaluation(examples, tmp_path: Path) -> None:
    with FakeOpenAIServer(respond=two_models) as llm:
        w = watch(llm.base_url, min_confidence=0.85)
        _, written, models = run(w, examples, tmp_path / "r.jsonl", "eager")
    # 0.8 sure is not sure enough: eager notifies about nothing.
    assert [r.got for r in written] == ["skip"] * 4
    assert models[0]["conditions"]["all"]["confusion"]["notify"] == {
        "notify": 0,
        "skip": 2,
        "none": 0,
    }


def test_invalid_answers_and_refused_changes_are_counted_apart(examples, tmp_path: Path) -> None:
    with FakeOpenAIServer() as llm:
        llm.queue(
            Reply.text("no"),  # the answer the issue quotes: not a verdict
            Reply.fail(400, "Requested tokens (5158) exceed context window of 4096"),
            Reply.text("{}"),
            Reply.verdict(SKIP),
        )
        stopped, written, models = run(watch(llm.base_url), examples, tmp_path / "r.jsonl")
    assert [r.answer for r in written] == ["invalid", "unanswered", "invalid", "verdict"]
    assert "exceed context window" in (written[1].error or "")
    overall = models[0]["conditions"]["all"]
    assert (overall["invalid"], overall["unanswered"]) == (2, 1)
    # No verdict counts as not notified: both wanted changes were missed.
    assert (overall["recall"], overall["precision"]) == (0.0, None)
    # None of these is the server's fault: the run went on to the end.
    assert stopped == [] and len(written) == 4


def test_a_server_that_keeps_failing_is_not_asked_about_the_rest(examples, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    stopped, written, models = run(watch("http://127.0.0.1:9/v1"), examples, results)
    assert len(written) == STOP_AFTER == 3
    assert {r.answer for r in written} == {"unanswered"}
    assert stopped == [
        "model 'sharp' at http://127.0.0.1:9/v1: stopped after 3 failures of its server in a "
        f"row ({written[-1].error}); the rest was not asked"
    ]
    assert never_answered(models, written) == [
        "model 'sharp' at http://127.0.0.1:9/v1 never answered (3 example(s)): could not "
        "connect to the model server (after 1 attempt)"
    ]


def test_a_resumed_run_asks_only_what_the_results_lack(examples, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    with FakeOpenAIServer(respond=two_models) as llm:
        w = watch(llm.base_url)
        run(w, examples[:2], results, "sharp")
        # A run killed while writing leaves its last line cut: it is dropped, and asked again.
        with results.open("a") as file:
            file.write('{"model": "sharp", "condit')
        assert len(read_results(results)) == 2
        _, written, _ = run(w, examples, results, "sharp", resume=True, done=_keys(results))
        assert len(llm.requests) == 4
    assert [r.example for r in written] == ["token leak", "new security issue", "typo", "feature"]
    # An edited condition is a different question: none of the results count for it.
    with FakeOpenAIServer(respond=two_models) as llm:
        edited = watch(llm.base_url, condition="The issue leaks a secret.")
        run(edited, examples, results, "sharp", resume=True, done=_keys(results))
        assert len(llm.requests) == 4
    assert len(read_results(results)) == 8


def _keys(results: Path) -> set[tuple[str, str, str, str]]:
    return {r.key for r in read_results(results)}


def test_a_bad_examples_file_names_file_and_place(tmp_path: Path) -> None:
    path = tmp_path / "security.yaml"
    path.write_text("examples:\n  - new: {title: x}\n    expect: maybe\n")
    with pytest.raises(EvalError, match=r"security\.yaml: examples\.0\.expect"):
        load_examples(path)
    with pytest.raises(EvalError, match="cannot read"):
        load_examples(tmp_path / "missing.yaml")


def test_feedback_becomes_examples(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    source = demo_config(demo_api)
    with FakeOpenAIServer(respond=sharp) as llm:
        w = judged_watch(llm)
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        with Judge(w.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, w, source, judge)
    with connect(warehouse_url) as wh:
        sent = wh.fetch_frame(
            "SELECT notification_id, object_key FROM outbox ORDER BY change_id LIMIT 2"
        )
        assert sent.height == 2
        first, second = sent["notification_id"].to_list()
        assert record_feedback(wh, first, "noise", "not a real leak") == w.name
        assert record_feedback(wh, second, "noise") == w.name
        # The latest word wins, one row per notification.
        record_feedback(wh, second, "useful")
        with pytest.raises(FeedbackError, match="no notification 'nope'"):
            record_feedback(wh, "nope", "useful")
        with pytest.raises(FeedbackError, match="one of useful, noise"):
            record_feedback(wh, first, "meh")
        examples = export_examples(wh, w.name)
        assert export_examples(wh, "other_watch") == []

    assert [e.expect for e in examples] == ["skip", "notify"]
    assert [e.key for e in examples] == sent["object_key"].to_list()
    assert examples[0].name.endswith(f"({first}): not a real leak")
    # The example shows the judge what the notification showed: the demo issue's values.
    assert examples[0].kind == "insert" and examples[0].old is None
    assert examples[0].new["number"] == int(examples[0].key)

    # Exported YAML is a valid examples file, and judging it reproduces the sharp model.
    path = tmp_path / "evals" / "sensitive.yaml"
    path.parent.mkdir()
    path.write_text(examples_yaml(w.name, examples))
    assert yaml.safe_load(path.read_text())["watch"] == w.name
    assert load_examples(path) == examples
