"""The eval harness and feedback: real judge calls over a loopback OpenAI-compatible server,
feedback stored in real warehouses and exported as examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from changewatch.evaluators.config import Watch
from changewatch.evaluators.evals import EvalError, format_scores, load_examples, score_model
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


def test_scores_each_model_against_the_labels(examples) -> None:
    with FakeOpenAIServer(respond=two_models) as llm:
        w = watch(llm.base_url)
        sharp_score = score_model(w, examples)
        eager_score = score_model(w, examples, model="eager")
        models = [r.body["model"] for r in llm.requests]
    assert models == ["sharp"] * 4 + ["eager"] * 4

    assert (sharp_score.precision, sharp_score.recall, sharp_score.agreement) == (1.0, 1.0, 1.0)
    assert sharp_score.misses == []
    assert (sharp_score.calls, sharp_score.prompt_tokens, sharp_score.completion_tokens) == (
        4,
        400,
        80,
    )
    # Eager flags all four: half of its notifications were wanted, and it missed none.
    assert (eager_score.precision, eager_score.recall, eager_score.agreement) == (0.5, 1.0, 0.5)
    assert eager_score.prompt_tokens + eager_score.completion_tokens == 4 * 230
    assert [m.split(":")[0] for m in eager_score.misses] == ["typo", "feature"]

    table = format_scores([sharp_score, eager_score]).splitlines()
    assert table[0].split() == [
        "model", "examples", "precision", "recall", "agreement", "calls", "tokens", "p50",
        "latency",
    ]  # fmt: skip
    assert table[1].split()[:7] == ["sharp", "4", "1.00", "1.00", "1.00", "4", "480"]
    assert table[2].split()[:7] == ["eager", "4", "0.50", "1.00", "0.50", "4", "920"]
    assert table[4].startswith("eager: typo: expected skip, got notify")


def test_min_confidence_applies_as_in_evaluation(examples) -> None:
    with FakeOpenAIServer(respond=two_models) as llm:
        score = score_model(watch(llm.base_url, min_confidence=0.85), examples, model="eager")
    # 0.8 sure is not sure enough: eager notifies about nothing.
    assert (score.true_positive, score.false_negative, score.true_negative) == (0, 2, 2)


def test_an_unreachable_model_answers_nothing_and_agrees_with_nothing(examples) -> None:
    score = score_model(watch("http://127.0.0.1:9/v1"), examples)
    assert score.unanswered == 4 and score.agreement == 0.0
    assert score.precision is None and score.recall is None
    assert "no answer" in score.misses[0]


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
