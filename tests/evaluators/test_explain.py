"""`explain`: the stored story of one object for one watch, on DuckDB and PostgreSQL."""

from __future__ import annotations

from changewatch.evaluators.config import Watch
from changewatch.evaluators.explain import explain_object, format_explanation
from changewatch.evaluators.judge import Judge
from changewatch.evaluators.judge_prompts import SHOWN_CHARS
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from openai_server import FakeOpenAIServer, label_judge
from test_evaluate import demo_config, evaluate


def security_watch(base_url: str) -> Watch:
    return Watch.model_validate(
        {
            "name": "sensitive",
            "sources": ["demo_issues"],
            "where": "changed(labels) OR kind = 'insert'",
            "judge": {
                "condition": "The issue is about a security problem.",
                "model": "sec-model",
                "base_url": base_url,
                "max_retries": 0,
                "timeout": 5,
            },
            "channels": ["console"],
        }
    )


def story(url: str, watch: Watch, source, key: str) -> str:
    with connect(url) as wh:
        return format_explanation(watch, key, explain_object(wh, watch, {source.name: source}, key))


def test_explain_tells_filter_verdict_dedupe_and_deliveries(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_config(demo_api)
    with FakeOpenAIServer(respond=label_judge("security")) as llm:
        watch = security_watch(llm.base_url)
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, watch, source, judge)

        with connect(warehouse_url) as wh:
            notified, dedupe = wh.fetch("SELECT object_key, dedupe_key FROM outbox LIMIT 1")[0]
            (skipped,) = wh.fetch(
                "SELECT object_key FROM evaluations WHERE decision = 'skip' LIMIT 1"
            )[0]
            # The same story is plain SQL.
            rows = wh.fetch(
                "SELECT decision, channel, delivery_status FROM decisions WHERE object_key = $1",
                (notified,),
            )
        assert rows == [("notify", "console", "pending")]

        text = story(warehouse_url, watch, source, notified)
        lines = text.splitlines()
        assert lines[0] == f"sensitive: object {notified}"
        assert lines[1].startswith("- demo_issues change ") and ": insert at " in lines[1]
        assert lines[2] == "    filter passed: where changed(labels) OR kind = 'insert'"
        assert lines[3].startswith("    judge (sec-model, fresh call): notify, confidence 0.90")
        assert lines[4].startswith("    notified: ") and f"(dedupe key {dedupe})" in lines[4]
        assert lines[5] == "    delivery to console: pending after 0 attempt(s)"
        # Then the prompt the model was sent about it, fenced: the request it got, verbatim.
        [sent] = [r for r in llm.requests if f"object key: {notified}\n" in r.text]
        system, user = (m["content"] for m in sent.messages)
        assert lines[6] == (
            "    prompt sent (whole: SELECT * FROM judge_prompts WHERE watch = 'sensitive' AND "
            f"content_hash = '{dedupe.split('|')[3]}'):"
        )
        assert lines[7] == lines[-1] == "    ```" and lines[8] == "    [system]"
        shown = "\n".join(line.removeprefix("    ") for line in lines[9:-1])
        cut = f"… [{len(system) - SHOWN_CHARS['system']} more characters]"
        assert shown == f"{system[: SHOWN_CHARS['system']]}{cut}\n[user]\n{user}"
        assert "The issue is about a security problem." in shown

        text = story(warehouse_url, watch, source, skipped)
        assert "judge (sec-model, fresh call): no, confidence 0.90" in text
        assert "not notified: the judge said no" in text
        assert f"object key: {skipped}\n" in text

        # An edit is a change; until the watch runs again it is pending.
        edited = demo_api.tracker.mutate(update=5)["updated"]
        with connect(warehouse_url) as wh:
            run_sync(wh, RestSource(source))
        key = str(edited[0])
        assert story(warehouse_url, watch, source, key).splitlines()[-1] == (
            "    not evaluated yet: the watch's next run will"
        )
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, watch, source, judge)
    last = story(warehouse_url, watch, source, key).split("\n- ")[-1]
    assert "not evaluated yet" not in last
    assert "filter passed" in last or "did not match the filter" in last

    assert story(warehouse_url, watch, source, "no-such-key") == (
        "sensitive: no change of 'no-such-key' in demo_issues"
    )
