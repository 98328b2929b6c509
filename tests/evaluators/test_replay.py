"""Replay: an edited filter or condition over stored history, nothing sent, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from changewatch.evaluators.config import Watch
from changewatch.evaluators.judge import Judge
from changewatch.evaluators.replay import format_replay, replay_watch, replayed
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from openai_server import FakeOpenAIServer, Request, label_judge
from test_evaluate import demo_config, evaluate

LONG_AGO = datetime.now(UTC) - timedelta(days=30)


def sent_state(url: str) -> tuple:
    with connect(url) as wh:
        return (
            wh.fetch("SELECT count(*) FROM outbox")[0][0],
            wh.fetch("SELECT count(*), count(delivered_at) FROM deliveries")[0],
        )


def test_an_edited_filter_adds_and_drops_against_what_was_sent(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    watch = Watch(
        name="bugs", sources=["demo_issues"], where="'bug' IN labels", channels=["console"]
    )
    with connect(warehouse_url) as wh:
        run_sync(wh, RestSource(source))
    assert evaluate(warehouse_url, watch, source).notified > 0
    before = sent_state(warehouse_url)

    edited = replayed(watch, where="'security' IN labels")
    with connect(warehouse_url) as wh:
        result = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO)
        labels = {
            str(number): set(names)
            for number, names in wh.fetch('SELECT number, labels FROM "issues"')
        }
        stored = wh.fetch(
            "SELECT count(*) FROM replays WHERE replay_version = $1", (result.version,)
        )
    # Nothing was sent or queued.
    assert sent_state(warehouse_url) == before

    outcome = dict(zip(result.changes["object_key"], result.changes["outcome"], strict=True))
    assert len(outcome) == len(labels) == stored[0][0]
    for key, names in labels.items():
        expected = {
            (True, True): "same",
            (False, False): "same",
            (False, True): "added",
            (True, False): "dropped",
        }[("bug" in names, "security" in names)]
        assert outcome[key] == expected, (key, names)
    assert 0 < result.count("added") and 0 < result.count("dropped")

    text = format_replay(edited, LONG_AGO, result).splitlines()
    assert text[0].startswith(f"replay {result.version} of bugs since ")
    assert f"{result.count('added')} added, {result.count('dropped')} dropped" in text[0]
    assert text[0].endswith("nothing was sent")
    assert sum(line.startswith("+ demo_issues ") for line in text) == result.count("added")

    # Replaying the same edit again replaces its rows; a later start sees nothing.
    with connect(warehouse_url) as wh:
        again = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO)
        assert wh.fetch("SELECT count(*) FROM replays")[0][0] == stored[0][0]
        later = replay_watch(
            wh, edited, {source.name: source}, since=datetime.now(UTC) + timedelta(minutes=1)
        )
    assert again.version == result.version and later.changes.height == 0


def test_an_edited_condition_is_judged_once_then_cached(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    models: list[str] = []
    security = label_judge("security")

    def respond(request: Request):
        models.append(request.text)
        return security(request)

    with FakeOpenAIServer(respond=respond) as llm:
        watch = Watch.model_validate(
            {
                "name": "sensitive",
                "sources": ["demo_issues"],
                "where": "kind = 'insert'",
                "judge": {
                    "condition": "The issue is about a security problem.",
                    "model": "m",
                    "base_url": llm.base_url,
                    "max_retries": 0,
                    "max_calls_per_run": 100,
                },
            }
        )
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, watch, source, judge)
        calls_then = len(models)

        # The same condition: every verdict is in the cache, the model is not asked.
        with connect(warehouse_url) as wh, Judge(watch.judge) as judge:  # type: ignore[arg-type]
            same = replay_watch(
                wh, replayed(watch), {source.name: source}, since=LONG_AGO, judge=judge
            )
        assert len(models) == calls_then
        assert same.stats.judge_cache_hits == same.stats.passed_filter
        assert same.count("same") == same.changes.height

        edited = replayed(watch, condition="The issue is about security or a bug.")
        assert "security or a bug" in edited.judge.condition  # type: ignore[union-attr]
        with connect(warehouse_url) as wh, Judge(edited.judge) as judge:  # type: ignore[arg-type]
            first = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO, judge=judge)
            asked = len(models) - calls_then
            second = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO, judge=judge)
    assert asked == first.stats.judged > 0
    assert len(models) - calls_then == asked  # the second replay was all cache
    assert second.stats.judge_cache_hits == second.stats.passed_filter
    assert "security or a bug" in models[-1]


def test_a_condition_needs_a_judge() -> None:
    watch = Watch(name="w", sources=["s"])
    with pytest.raises(ValueError, match="watch 'w' has no judge"):
        replayed(watch, condition="anything")
