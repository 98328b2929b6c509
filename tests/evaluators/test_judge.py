"""The LLM judge against a fake OpenAI-compatible server over real HTTP (nothing patched)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.judge import (
    ChangeForJudge,
    Judge,
    JudgeConfigError,
    JudgeOutcome,
    Verdict,
    build_client,
    judge_version,
)
from openai_server import FakeOpenAIServer, Reply

KEY_ENV = "CW_TEST_JUDGE_KEY"
KEY = "sk-test-S3CRET-0123456789abcdef"

VERDICT = {
    "reasoning": "The issue moved to the closed state and it is labelled as a bug.",
    "should_notify": True,
    "urgency": "high",
    "summary": "Issue 42 (a bug) was closed.",
    "confidence": 0.9,
}
CHANGE = ChangeForJudge(
    watch="closed_bugs",
    source="tracker_issues",
    kind="update",
    object_key="42",
    old={"id": 42, "state": "open", "labels": ["bug"], "title": "Crash on {save}"},
    new={"id": 42, "state": "closed", "labels": ["bug"], "title": "Crash on {save}"},
    changed_columns=["state"],
    url="https://tracker.example/issues/42",
)


@pytest.fixture
def llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return KEY


def config(server: FakeOpenAIServer | None = None, **overrides: Any) -> JudgeConfig:
    settings: dict[str, Any] = {
        "condition": "A bug was closed",
        "examples": ["an issue labelled bug moves to closed"],
        "negative_examples": ["a feature request is closed"],
        "model": "judge-model",
        "base_url": server.base_url if server else "http://127.0.0.1:9/v1",
        "api_key_env": KEY_ENV,
        "timeout": 5.0,
        "max_retries": 2,
    }
    settings.update(overrides)
    return JudgeConfig(**settings)


def evaluate(cfg: JudgeConfig, change: ChangeForJudge = CHANGE) -> JudgeOutcome:
    with Judge(cfg) as judge:
        return judge.evaluate(change)


def test_valid_verdict(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT, prompt_tokens=321, completion_tokens=54))
    cfg = config(llm)

    outcome = evaluate(cfg)

    assert outcome.verdict == Verdict(**VERDICT)
    assert outcome.error is None
    assert outcome.notify
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (321, 54)
    assert outcome.attempts == 1
    assert outcome.latency_ms > 0
    assert outcome.model == "judge-model"
    assert outcome.judge_version == judge_version(cfg)
    [request] = llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "judge-model"
    assert request.body["response_format"] == {"type": "json_object"}
    assert "tools" not in request.body


def test_prompt_presents_condition_examples_and_change(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT))
    evaluate(config(llm))

    system, user = llm.requests[0].messages
    assert system["role"] == "system" and user["role"] == "user"
    assert "A bug was closed" in system["content"]
    assert "- an issue labelled bug moves to closed" in system["content"]
    assert "- a feature request is closed" in system["content"]
    # instructor's Mode.JSON appends the Verdict schema to the system prompt.
    assert '"should_notify"' in system["content"]
    for text in (
        'watch "closed_bugs"',
        "source: tracker_issues",
        "kind: update",
        "object key: 42",
        "changed columns: state",
        '"state":"open"',
        '"state":"closed"',
        '"title":"Crash on {save}"',
        "https://tracker.example/issues/42",
    ):
        assert text in user["content"]


def test_invalid_json_then_valid_feeds_the_error_back(llm: FakeOpenAIServer) -> None:
    llm.queue(
        Reply.text("Sure! {should_notify: yes", prompt_tokens=100, completion_tokens=10),
        Reply.verdict(VERDICT, prompt_tokens=150, completion_tokens=30),
    )

    outcome = evaluate(config(llm))

    assert outcome.verdict == Verdict(**VERDICT)
    assert outcome.attempts == 2
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (250, 40)
    first, second = llm.requests
    assert len(second.messages) == len(first.messages) + 2
    assert second.messages[-2]["role"] == "assistant"
    assert second.messages[-2]["content"] == "Sure! {should_notify: yes"
    assert second.messages[-1]["role"] == "user"
    assert "Invalid JSON" in second.messages[-1]["content"]
    assert "validation error" in second.messages[-1]["content"]


def test_missing_fields_until_retries_run_out(llm: FakeOpenAIServer) -> None:
    partial = {"reasoning": "It is a bug.", "should_notify": True}
    llm.queue(
        Reply.verdict(partial, prompt_tokens=100, completion_tokens=10),
        Reply.verdict(partial, prompt_tokens=120, completion_tokens=11),
    )

    outcome = evaluate(config(llm, max_retries=1))

    assert outcome.verdict is None
    assert not outcome.notify
    assert outcome.error is not None
    assert "validation" in outcome.error
    assert "urgency" in outcome.error and "Field required" in outcome.error
    assert outcome.attempts == 2
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (220, 21)
    assert "urgency" in llm.requests[1].messages[-1]["content"]
    assert llm.pending == 0


def test_out_of_range_confidence_is_a_validation_error(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict({**VERDICT, "confidence": 7}), Reply.verdict(VERDICT))

    outcome = evaluate(config(llm))

    assert outcome.verdict == Verdict(**VERDICT)
    assert outcome.attempts == 2
    assert "confidence" in llm.requests[1].messages[-1]["content"]


def test_server_error_is_retried(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.fail(500), Reply.verdict(VERDICT, prompt_tokens=80, completion_tokens=9))

    outcome = evaluate(config(llm))

    assert outcome.verdict == Verdict(**VERDICT)
    assert outcome.attempts == 2
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (80, 9)
    # A transient error re-sends the same request (no validation feedback).
    assert llm.requests[0].body == llm.requests[1].body


def test_rate_limit_waits_for_retry_after(llm: FakeOpenAIServer) -> None:
    llm.queue(
        Reply.fail(
            429, "Rate limit reached", code="rate_limit_exceeded", headers={"retry-after-ms": "150"}
        ),
        Reply.verdict(VERDICT),
    )

    start = time.monotonic()
    outcome = evaluate(config(llm))

    assert outcome.verdict == Verdict(**VERDICT)
    assert outcome.attempts == 2
    assert time.monotonic() - start >= 0.15


def test_server_errors_until_retries_run_out(llm: FakeOpenAIServer) -> None:
    llm.queue(
        Reply.fail(503, "overloaded", headers={"retry-after": "0"}),
        Reply.fail(503, "overloaded", headers={"retry-after": "0"}),
    )

    outcome = evaluate(config(llm, max_retries=1))

    assert outcome.verdict is None
    assert outcome.error is not None and "HTTP 503" in outcome.error
    assert "overloaded" in outcome.error
    assert outcome.attempts == 2
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (0, 0)


def test_quota_exhausted_is_not_retried(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.fail(429, "You exceeded your current quota", code="insufficient_quota"))

    outcome = evaluate(config(llm))

    assert outcome.verdict is None
    assert outcome.error is not None and "429" in outcome.error
    assert "insufficient_quota" in outcome.error
    assert outcome.attempts == 1


def test_authentication_error_is_quick_and_secret_free(
    llm: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A server that echoes the key it was given back in its error message.
    llm.queue(Reply.fail(401, f"Incorrect API key provided: {KEY}", code="invalid_api_key"))

    start = time.monotonic()
    with caplog.at_level(logging.DEBUG):
        outcome = evaluate(config(llm))
    elapsed = time.monotonic() - start

    assert outcome.verdict is None
    assert outcome.error is not None
    assert "authentication" in outcome.error
    assert KEY_ENV in outcome.error
    assert KEY not in outcome.error
    assert KEY not in repr(outcome)
    assert KEY not in caplog.text
    assert outcome.attempts == 1
    assert elapsed < 2
    assert llm.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_secret_redacted_from_other_error_messages(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.fail(400, f"bad request from key {KEY}"))

    outcome = evaluate(config(llm))

    assert outcome.error is not None and "HTTP 400" in outcome.error
    assert KEY not in outcome.error
    assert "***" in outcome.error
    assert outcome.attempts == 1


def test_timeout_gives_up_in_bounded_time(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT, delay=10))

    start = time.monotonic()
    outcome = evaluate(config(llm, timeout=0.5))
    elapsed = time.monotonic() - start

    assert outcome.verdict is None
    assert outcome.error is not None and "0.5s" in outcome.error
    assert outcome.attempts == 1
    assert 0.4 < elapsed < 3


def test_unreachable_server(unused_port: int) -> None:
    cfg = config(base_url=f"http://127.0.0.1:{unused_port}/v1", max_retries=0)

    outcome = evaluate(cfg)

    assert outcome.verdict is None
    assert outcome.error is not None and "could not connect" in outcome.error
    assert outcome.attempts == 1


def test_truncated_answer(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.text('{"reasoning": "The issue', finish_reason="length"))

    outcome = evaluate(config(llm))

    assert outcome.verdict is None
    assert outcome.error is not None and "cut off" in outcome.error
    assert outcome.attempts == 1
    assert outcome.prompt_tokens == 100


def test_low_confidence_does_not_notify(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict({**VERDICT, "confidence": 0.6}))

    outcome = evaluate(config(llm, min_confidence=0.8))

    assert outcome.verdict is not None and outcome.verdict.should_notify
    assert not outcome.notify
    assert outcome.error is None


def test_no_notify_verdict(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict({**VERDICT, "should_notify": False, "urgency": "Low"}))

    outcome = evaluate(config(llm))

    assert outcome.verdict is not None
    assert outcome.verdict.urgency == "low"
    assert not outcome.notify


def test_judge_version_tracks_what_the_model_is_asked() -> None:
    base = config()
    version = judge_version(base)
    assert len(version) == 16 and int(version, 16) >= 0
    assert judge_version(config()) == version

    changed = [
        config(condition="A bug was reopened"),
        config(examples=["an issue labelled bug moves to closed", "a crash is fixed"]),
        config(examples=[]),
        config(negative_examples=["a duplicate is closed"]),
    ]
    versions = {judge_version(c) for c in changed}
    assert version not in versions and len(versions) == len(changed)

    same = [
        config(model="another-model"),
        config(min_confidence=0.9),
        config(timeout=1.0),
        config(max_retries=0),
        config(max_calls_per_run=3),
        config(base_url="http://elsewhere/v1"),
        config(api_key_env=None),
        config(on_unavailable="drop"),
    ]
    assert {judge_version(c) for c in same} == {version}


def test_local_server_without_api_key(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT))

    outcome = evaluate(config(llm, api_key_env=None))

    assert outcome.verdict == Verdict(**VERDICT)
    assert KEY not in llm.requests[0].headers.get("authorization", "")


def test_base_url_without_v1(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT))

    outcome = evaluate(config(llm, base_url=llm.base_url.removesuffix("/v1")))

    assert outcome.verdict == Verdict(**VERDICT)
    assert llm.requests[0].path == "/chat/completions"


def test_missing_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)

    with pytest.raises(JudgeConfigError, match=KEY_ENV):
        build_client(config())


def test_build_client_settings() -> None:
    client = build_client(config(timeout=7.5))
    try:
        assert client.max_retries == 0
        assert client.timeout == 7.5
        assert client.api_key == KEY
    finally:
        client.close()


def test_injected_client_is_left_open(llm: FakeOpenAIServer) -> None:
    llm.queue(Reply.verdict(VERDICT), Reply.verdict(VERDICT))
    cfg = config(llm)
    client = build_client(cfg)
    try:
        with Judge(cfg, client=client) as judge:
            assert judge.evaluate(CHANGE).verdict is not None
        assert KEY not in repr(judge)
        with Judge(cfg, client=client) as judge:
            assert judge.evaluate(CHANGE).verdict is not None
    finally:
        client.close()


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
