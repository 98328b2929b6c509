"""Odd answers of an OpenAI-compatible server, at the wire: held like any bad answer, or cut.

The fake server answers one change with an empty ``choices`` list and another with a huge
reasoning; the evaluation goes on, on both backends.
"""

from __future__ import annotations

from changewatch.evaluators.judge import Judge
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply, Request, label_judge
from test_evaluate import demo_config, evaluate, judged_watch, sync

security = label_judge("security")


def answers_for(odd: dict[str, Reply]):
    """The security model, except for the issues whose number is a key of ``odd``."""

    def respond(request: Request) -> Reply:
        for number, reply in odd.items():
            if f'"number":{number},' in request.text:
                return reply
        return security(request)

    return respond


def test_an_answer_without_choices_holds_that_change_only(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    with FakeOpenAIServer(respond=answers_for({"7": Reply.empty()})) as llm:
        watch = judged_watch(llm)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            stats = evaluate(warehouse_url, watch, source, judge)
    assert (stats.changes_read, stats.judged, stats.judge_errors, stats.held) == (40, 39, 1, 1)
    with connect(warehouse_url) as wh:
        held = wh.fetch("SELECT object_key, judge_error FROM evaluations WHERE decision = 'held'")
        settled = wh.fetch("SELECT count(*) FROM evaluations WHERE decision IN ('notify', 'skip')")
    assert held == [
        ("7", "no valid verdict after 1 attempt: No choices in OpenAI response (mode: json_mode)")
    ]
    assert settled == [(39,)]


def test_a_huge_reasoning_is_cut_before_it_is_stored(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    sync(warehouse_url, source)
    rambling = Reply.verdict(
        {
            "reasoning": "because " * 125_000,  # a million characters
            "should_notify": True,
            "urgency": "high",
            "summary": "S" * 5000,
            "confidence": 0.9,
        }
    )
    with FakeOpenAIServer(respond=answers_for({"3": rambling})) as llm:
        watch = judged_watch(llm)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            stats = evaluate(warehouse_url, watch, source, judge)
    assert stats.judged == 40
    with connect(warehouse_url) as wh:
        stored = wh.fetch(
            "SELECT length(e.reasoning), length(e.summary), length(j.reasoning), "
            "length(j.summary), length(o.summary), e.reasoning "
            "FROM evaluations AS e JOIN judge_cache AS j ON j.content_hash = e.content_hash "
            "JOIN outbox AS o ON o.notification_id = e.notification_id "
            "WHERE e.object_key = '3'"
        )
        longest = wh.fetch("SELECT max(length(reasoning)) FROM judge_cache")
    ((reasoning, summary, cached_reasoning, cached_summary, notified_summary, text),) = stored
    assert (reasoning, cached_reasoning) == (4000, 4000)
    assert (summary, cached_summary, notified_summary) == (1000, 1000, 1000)
    assert text.startswith("because because")
    assert text.endswith("[cut at 4000 characters: raise judge.max_reasoning_chars]")
    assert longest == [(4000,)]
