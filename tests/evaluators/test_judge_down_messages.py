"""What `explain` and `replay` say when the judge did not answer, or the filter did not match.

Real warehouses (both backends), the demo API, and a model server that fails or refuses
connections at the wire.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from changewatch.evaluators.config import Watch
from changewatch.evaluators.explain import explain_object, format_explanation
from changewatch.evaluators.judge import Judge
from changewatch.evaluators.replay import format_replay, replay_watch
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply
from test_evaluate import demo_config, evaluate, sync
from test_replay import LONG_AGO


def watch_judged_at(base_url: str) -> Watch:
    return Watch.model_validate(
        {
            "name": "sensitive",
            "sources": ["demo_issues"],
            "where": "kind = 'insert' AND number > 1",
            "judge": {
                "condition": "The issue is about a security problem.",
                "model": "sec-model",
                "base_url": base_url,
                "max_retries": 0,
                "timeout": 5,
            },
        }
    )


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A model endpoint that refuses connections: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def story(url: str, watch: Watch, source, key: str) -> list[str]:
    with connect(url) as wh:
        frame = explain_object(wh, watch, {source.name: source}, key)
    return format_explanation(watch, key, frame).splitlines()


def test_explain_says_a_judge_error_once_and_a_miss_is_no_failure(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    with FakeOpenAIServer(respond=lambda request: Reply.fail(500)) as llm:
        watch = watch_judged_at(llm.base_url)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            stats = evaluate(warehouse_url, watch, source, judge)
    # Three calls fail, then the judge counts as down: the rest are held without a call.
    assert (stats.judge_errors, stats.held) == (3, 39)
    with connect(warehouse_url) as wh:
        errors = wh.fetch("SELECT DISTINCT judge_error FROM evaluations WHERE decision = 'held'")
    (error,) = {e for (e,) in errors}  # the calls' reason, and the same for those not asked
    assert error.startswith("model server error (HTTP 500)"), error

    assert story(warehouse_url, watch, source, "1")[2] == (
        "    did not match the filter: where kind = 'insert' AND number > 1"
    )
    for key in ("2", "40"):  # asked and failed; held without a call once the judge was down
        lines = story(warehouse_url, watch, source, key)
        assert lines[2] == "    filter passed: where kind = 'insert' AND number > 1"
        assert lines[3] == f"    not judged: {error}; held, retried next run"
        assert "judge unavailable" not in "\n".join(lines)


def test_replay_says_why_changes_are_undecided(
    warehouse_url: str, demo_api: DemoAPIServer, refused_url: str
) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    watch = watch_judged_at(refused_url)
    with Judge(watch.judge) as judge, connect(warehouse_url) as wh:  # type: ignore[arg-type]
        result = replay_watch(wh, watch, {source.name: source}, since=LONG_AGO, judge=judge)
    summary = format_replay(watch, LONG_AGO, result).splitlines()[0]
    assert result.count("undecided") == 39
    assert summary.endswith(
        f", 39 undecided (judge unreachable at {refused_url}); nothing was sent"
    ), summary
    reasons = dict(zip(result.changes["object_key"], result.changes["reason"], strict=True))
    assert reasons["1"] == "did not match the filter"
