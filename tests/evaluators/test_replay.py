"""Replay: an edited filter or condition over stored history, nothing sent, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
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


def test_a_replay_spends_the_daily_budget_like_an_evaluation(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    with FakeOpenAIServer(respond=label_judge("security")) as llm:
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
                    "max_calls_per_day": 30,
                },
            }
        )
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            assert evaluate(warehouse_url, watch, source, judge).judge_calls == 30
        # An edited condition is new content to the cache: only what is left today is asked.
        edited = replayed(watch, condition="The issue is about security or a bug.")
        with connect(warehouse_url) as wh, Judge(edited.judge) as judge:  # type: ignore[arg-type]
            result = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO, judge=judge)
            spend = wh.fetch("SELECT calls FROM judge_spend")
        assert len(llm.requests) == 30 and spend == [(30,)]
        assert (result.stats.judge_calls, result.count("undecided")) == (0, 40)
        assert (result.stats.daily_budget, result.stats.held_for_budget) == (30, 40)
        assert " 40 undecided (daily budget of 30 calls reached, replays included);" in (
            format_replay(edited, LONG_AGO, result)
        )

        # The next day (the spend forgotten): the replay asks the day's 30, and they count.
        with connect(warehouse_url) as wh, wh.transaction():
            wh.execute("DELETE FROM judge_spend")
        with connect(warehouse_url) as wh, Judge(edited.judge) as judge:  # type: ignore[arg-type]
            result = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO, judge=judge)
            assert result.stats.judge_calls == 30 and result.count("undecided") == 10
            assert wh.fetch("SELECT calls FROM judge_spend") == [(30,)]


def test_a_suppressed_duplicate_is_listed_as_a_duplicate_not_dropped(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    # One notification per object: about its first update, then duplicates.
    watch = Watch(
        name="edited", sources=["demo_issues"], where="kind = 'update'", dedupe="per_object"
    )
    with connect(warehouse_url) as wh:
        run_sync(wh, RestSource(source))
    evaluate(warehouse_url, watch, source)
    for _ in range(2):
        demo_api.tracker.mutate(update=40)
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        evaluate(warehouse_url, watch, source)
    with connect(warehouse_url) as wh:
        then = dict(wh.fetch("SELECT decision, count(*) FROM evaluations GROUP BY decision"))
    assert then == {"skip": 40, "notify": 40, "duplicate": 40}

    # Every change passes now: an object's insert notifies, and its first update (sent then)
    # is suppressed by that notification's key: a duplicate, not a dropped notification.
    edited = replayed(watch, where="TRUE")
    with connect(warehouse_url) as wh:
        result = replay_watch(wh, edited, {source.name: source}, since=LONG_AGO)
    assert {o: result.count(o) for o in ("added", "dropped", "duplicate", "same")} == {
        "added": 40,
        "dropped": 0,
        "duplicate": 40,
        "same": 40,
    }
    text = format_replay(edited, LONG_AGO, result).splitlines()
    assert "40 added, 0 dropped, 40 duplicate(s), 40 unchanged" in text[0]
    first = result.changes.filter(pl.col("outcome") == "added").sort("object_key")
    dup = result.changes.filter(pl.col("outcome") == "duplicate").sort("object_key")
    assert dup["reason"][0] == f"duplicate of change {first['change_id'][0]} (same dedupe key)"
    assert sum(line.startswith("= demo_issues ") for line in text) == 40
    assert not any(line.startswith("- ") for line in text)
