"""What one change can do to the judge: a prompt over the model's context is cut to fit (and
the verdict says so), every request bounds its answer, and a change's own problem (too long,
an invalid answer) never trips the breaker that keeps a down server from being asked."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from changewatch.evaluators import local_model
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.judge import ChangeForJudge, Judge, JudgeConfigError
from changewatch.evaluators.prompt_fit import estimate_tokens
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply, Request
from test_evaluate import demo_config, evaluate, judged_watch, security_model, sync

VERDICT = {
    "reasoning": "The body describes a production outage.",
    "should_notify": True,
    "urgency": "urgent",
    "summary": "Production is down.",
    "confidence": 0.9,
}


def config(base_url: str, **options: object) -> JudgeConfig:
    return JudgeConfig.model_validate(
        {
            "condition": "The issue reports a production outage.",
            "model": "m",
            "base_url": base_url,
            "max_retries": 1,
            "timeout": 5,
        }
        | options
    )


def issue(body: str, **values: object) -> ChangeForJudge:
    new = {"title": "Primary database down", "labels": ["incident"], "body": body} | values
    return ChangeForJudge("outages", "issues", "insert", "4306", None, new, None)


def test_an_oversized_change_is_cut_to_fit_and_its_verdict_says_so() -> None:
    body = "The primary is unreachable. " + "Stack trace line. " * 2800  # about 50 KB
    with FakeOpenAIServer() as llm:
        llm.queue(Reply.verdict(VERDICT))
        with Judge(config(llm.base_url, context_tokens=4096)) as judge:
            outcome = judge.evaluate(issue(body))
        (request,) = llm.requests
    system, user = (m["content"] for m in request.messages)
    # The whole request fits the 4096 tokens even counted conservatively, answer included.
    assert estimate_tokens(system) + estimate_tokens(user) + 512 <= 4096
    assert request.body["max_tokens"] == 512
    # The short values are whole; the long body lost its tail, and says so.
    # (The values go in key order: the same values make the same prompt from any path.)
    assert '"labels":["incident"],"title":"Primary database down"' in user
    assert '{"body":"The primary is unreachable. Stack trace line.' in user
    assert "…[cut]" in user and len(user) < 12_000
    assert outcome.verdict is not None and outcome.notify
    reasoning = outcome.verdict.reasoning
    assert reasoning.startswith(
        f"[Cut to fit the model's context of 4096 tokens: new.body cut from {len(body)} to "
    )
    assert reasoning.endswith("characters.] The body describes a production outage.")


def test_a_change_that_fits_is_sent_whole() -> None:
    with FakeOpenAIServer() as llm:
        llm.queue(Reply.verdict(VERDICT))
        with Judge(config(llm.base_url)) as judge:
            outcome = judge.evaluate(issue("x" * 15_000))  # fits the default 8192 tokens
    assert '"body":"' + "x" * 15_000 + '","labels"' in llm.requests[0].messages[-1]["content"]
    assert outcome.verdict is not None and not outcome.verdict.reasoning.startswith("[Cut")


def test_every_request_bounds_its_answer() -> None:
    with FakeOpenAIServer() as llm:
        llm.queue(Reply.text("no"), Reply.verdict(VERDICT))  # a re-ask is a request too
        with Judge(config(llm.base_url, max_answer_tokens=300)) as judge:
            outcome = judge.evaluate(issue("down"))
    assert outcome.attempts == 2
    assert [r.body["max_tokens"] for r in llm.requests] == [300, 300]


def test_a_change_that_cannot_fit_is_its_own_problem_and_costs_no_request() -> None:
    columns = {f"column_{i}": i for i in range(2000)}  # 2,000 short values: nothing to cut
    with FakeOpenAIServer() as llm:
        with Judge(config(llm.base_url, context_tokens=4096)) as judge:
            outcome = judge.evaluate(issue("down", **columns))
        assert llm.requests == []
    assert (outcome.verdict, outcome.fault, outcome.attempts) == (None, "change", 0)
    assert outcome.error == (
        "the change does not fit even with every value cut to fit the model's 4096 tokens"
    )


def test_a_prompt_with_no_room_for_a_change_fails_the_judge_naming_the_setting() -> None:
    examples = [f"An outage of service number {i}, reported by a customer" for i in range(400)]
    with pytest.raises(JudgeConfigError, match=r"of the model's 4096 tokens \(context_tokens\)"):
        Judge(config("http://127.0.0.1:9/v1", context_tokens=4096, examples=examples))


def test_a_change_s_own_problem_does_not_trip_the_breaker(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    calls = itertools.count()

    def respond(request: Request) -> Reply:
        call = next(calls)
        if call < 3:  # three changes too long for the server, one after the other
            return Reply.fail(400, "Requested tokens (5158) exceed context window of 4096")
        if call == 3:
            return Reply.text("no")  # and an invalid answer
        return security_model(request)

    with FakeOpenAIServer(respond=respond) as llm:
        watch = judged_watch(llm)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            stats = evaluate(warehouse_url, watch, source, judge)
        # Every change was asked about: none was held for another change's problem.
        assert len(llm.requests) == 40
    assert (stats.judged, stats.judge_errors, stats.held) == (36, 4, 4)
    with connect(warehouse_url) as wh:
        held = wh.fetch(
            "SELECT judge_error FROM evaluations WHERE decision = 'held' ORDER BY change_id"
        )
    assert [error.split(" (HTTP")[0].split(" after")[0] for (error,) in held] == [
        "model server error",
        "model server error",
        "model server error",
        "no valid verdict",
    ]
    assert "exceed context window" in held[0][0]


def test_the_server_s_faults_still_trip_it(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    with FakeOpenAIServer(respond=lambda request: Reply.fail(503)) as llm:
        watch = judged_watch(llm)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            stats = evaluate(warehouse_url, watch, source, judge)
        assert len(llm.requests) == 3
    assert (stats.judged, stats.judge_errors, stats.held) == (0, 3, 40)


def test_a_missing_local_model_names_the_path_it_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "models" / "judge.gguf"
    monkeypatch.setenv(local_model.MODEL_ENV, str(missing))
    with pytest.raises(JudgeConfigError) as error:
        Judge(config("http://127.0.0.1:9/v1", model="local"))
    assert str(error.value).startswith(
        f"the local model's file is missing: looked for {missing} ($CHANGEWATCH_LOCAL_MODEL)"
    )
