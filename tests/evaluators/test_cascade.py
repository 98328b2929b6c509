"""Judge cascades with two scripted model servers on loopback: a quick judge answers every
change, a careful one only what the quick one was unsure of; in evaluation (DuckDB and
PostgreSQL) and in `changewatch eval`'s scoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from changewatch.evaluators.cascade import Cascade, make_judge
from changewatch.evaluators.config import JudgeConfig, Watch
from changewatch.evaluators.eval_report import format_report, report
from changewatch.evaluators.eval_results import ResultsWriter, read_results
from changewatch.evaluators.eval_run import EvalSet, run_eval
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import ChangeForJudge, Judge, judge_version
from changewatch.evaluators.replay import replay_watch, replayed
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply, Request
from pydantic import ValidationError
from test_evaluate import demo_config, evaluate, sync
from test_replay import LONG_AGO

CONDITION = "The issue is about a security problem."


def verdict(notify: bool, confidence: float, why: str) -> Reply:
    return Reply.verdict(
        {
            "reasoning": why,
            "should_notify": notify,
            "urgency": "high" if notify else "low",
            "summary": "A security issue." if notify else "Nothing to see.",
            "confidence": confidence,
        }
    )


def quick(request: Request) -> Reply:
    """Sure about security issues and plain ones; unsure (0.6) about bugs."""
    if '"security"' in request.text:
        return verdict(True, 0.95, "Labelled security.")
    if '"bug"' in request.text:
        return verdict(True, 0.6, "A bug might be a security problem.")
    return verdict(False, 0.95, "Nothing about security.")


def careful(request: Request) -> Reply:
    """Notifies exactly about issues labelled security."""
    secure = '"security"' in request.text
    return verdict(secure, 0.9, "Checked the labels." if secure else "A bug, not a security one.")


def cascade(first: FakeOpenAIServer | str, second: FakeOpenAIServer, **first_options: Any):
    url = first if isinstance(first, str) else first.base_url
    return [
        {"condition": CONDITION, "model": "quick", "base_url": url, "max_retries": 0, "timeout": 5}
        | first_options,
        {"model": "careful", "base_url": second.base_url, "when": "unsure", "max_retries": 0},
    ]


def test_only_unsure_verdicts_go_to_the_next_judge(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    issues = demo_api.tracker.snapshot()
    labels = [{label["name"] for label in issue["labels"]} for issue in issues]
    secure = sum("security" in names for names in labels)
    unsure = sum("bug" in names and "security" not in names for names in labels)
    assert secure and unsure, "the demo data should hold both"

    with FakeOpenAIServer(respond=quick) as first, FakeOpenAIServer(respond=careful) as second:
        watch = Watch.model_validate(
            {
                "name": "sensitive",
                "sources": ["demo_issues"],
                "where": "kind = 'insert'",
                "judge": cascade(first, second),
            }
        )
        sync(warehouse_url, source)
        with make_judge(watch.judge) as judge:  # type: ignore[arg-type]
            assert isinstance(judge, Cascade)
            stats = evaluate(warehouse_url, watch, source, judge)
        # The quick judge saw every change, the careful one only the unsure bugs.
        assert (len(first.requests), len(second.requests)) == (40, unsure)
        assert all('"bug"' in r.text and '"security"' not in r.text for r in second.requests)
        # One judgement per change against the caps; every request counted.
        assert (stats.judged, stats.judge_calls, stats.judge_requests) == (40, 40, 40 + unsure)
        assert stats.notified == secure
        with connect(warehouse_url) as wh:
            escalated = wh.fetch(
                "SELECT DISTINCT decision, confidence, reasoning FROM evaluations"
                " WHERE reasoning LIKE '[quick:%'"
            )
            model = wh.fetch("SELECT DISTINCT model FROM judge_cache")
        assert escalated == [
            (
                "skip",
                0.9,
                "[quick: notify at 0.60, below 0.80; asked careful.] A bug, not a security one.",
            )
        ]
        assert model == [("quick",)]

        # Replayed unchanged: every verdict comes from the cache, neither judge is asked.
        with connect(warehouse_url) as wh, make_judge(watch.judge) as judge:  # type: ignore[arg-type]
            same = replay_watch(
                wh, replayed(watch), {source.name: source}, since=LONG_AGO, judge=judge
            )
        assert same.stats.judge_cache_hits == 40 and same.count("same") == 40
        assert (len(first.requests), len(second.requests)) == (40, unsure)


def test_a_first_judge_without_an_answer_passes_the_change_on() -> None:
    change = ChangeForJudge("w", "issues", "insert", "7", None, {"labels": ["bug"]}, None)
    with FakeOpenAIServer(respond=careful) as second:
        config = JudgeConfig.model_validate(cascade("http://127.0.0.1:9/v1", second))
        with make_judge(config) as judge:
            outcome = judge.evaluate(change)
    assert outcome.verdict is not None and not outcome.notify
    assert outcome.verdict.reasoning.startswith(
        "[quick: no verdict (could not connect to the model server (after 1 attempt)); "
        "asked careful.]"
    )
    assert [stage.model for stage in outcome.stages] == ["quick", "careful"]


def test_eval_scores_the_cascade_and_each_judge_alone(tmp_path: Path) -> None:
    examples = [
        EvalExample(name="leak", kind="insert", new={"labels": ["security"]}, expect="notify"),
        EvalExample(name="crash", kind="insert", new={"labels": ["bug"]}, expect="skip"),
        EvalExample(name="idea", kind="insert", new={"labels": ["feature"]}, expect="skip"),
        EvalExample(
            name="xss", kind="insert", new={"labels": ["bug", "security"]}, expect="notify"
        ),
    ]
    results = tmp_path / "results.jsonl"
    with FakeOpenAIServer(respond=quick) as first, FakeOpenAIServer(respond=careful) as second:
        config = JudgeConfig.model_validate(cascade(first, second))
        eval_set = EvalSet("security", "sensitive", config, examples)
        with ResultsWriter(results) as writer:
            assert run_eval([eval_set], [None], writer) == []
        # Each judge was asked each example once: the careful one's answer within the cascade
        # is its answer alone too.
        assert (len(first.requests), len(second.requests)) == (4, 4)
        # A resumed run has everything: nobody is asked again.
        done = {r.key for r in read_results(results)}
        with ResultsWriter(results, resume=True) as writer:
            run_eval([eval_set], [None], writer, done=done)
        assert (len(first.requests), len(second.requests)) == (4, 4)

    models = {m["model"]: m for m in report(read_results(results))}
    assert list(models) == ["quick > careful", "quick", "careful"]
    f1 = {name: m["conditions"]["all"]["f1"] for name, m in models.items()}
    # Quick alone notifies the unsure bug; the cascade asks careful about it and gets it right.
    assert f1 == {"quick > careful": 1.0, "quick": 0.8, "careful": 1.0}
    assert models["quick > careful"]["asked"] == {"quick": 4, "careful": 1}
    assert models["quick > careful"]["conditions"]["all"]["calls"] == 5
    assert "asked" not in models["quick"]
    text = format_report(list(models.values()), misses=False)
    assert "judges asked: quick 4, careful 1 (of 4 examples)" in text


def test_cascade_settings() -> None:
    single = {"condition": CONDITION, "model": "quick"}
    listed = JudgeConfig.model_validate([single, {"model": "careful", "when": "unsure"}])
    nested = JudgeConfig.model_validate(single | {"then": [{"model": "careful", "when": "unsure"}]})
    assert listed == nested and [j.model for j in listed.judges()] == ["quick", "careful"]
    assert listed.judges()[1].condition == CONDITION
    # A cascade is another judge version; a single judge's version is what it always was.
    assert judge_version(listed) != judge_version(JudgeConfig.model_validate(single))
    assert judge_version(listed.judges()[0]) == judge_version(JudgeConfig.model_validate(single))
    with pytest.raises(ValidationError, match="first judge of a cascade"):
        JudgeConfig.model_validate([single | {"when": "unsure"}])
    with pytest.raises(ValidationError, match=r"then\.0\.when"):
        JudgeConfig.model_validate([single, {"model": "careful"}])
    with pytest.raises(ValueError, match="evaluators.cascade.make_judge"):
        Judge(listed)
