"""A change judged in the pipeline, then again from its exported feedback (`changewatch eval
WATCH --export-feedback` -> examples file -> eval), is sent the same prompt byte for byte."""

from __future__ import annotations

from pathlib import Path

from changewatch.evaluators.eval_results import ResultsWriter
from changewatch.evaluators.eval_run import EvalSet, run_eval
from changewatch.evaluators.evals import load_examples
from changewatch.evaluators.feedback import examples_yaml, export_examples, record_feedback
from changewatch.evaluators.judge import Judge
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply
from test_evaluate import demo_config, evaluate, judged_watch, sync

NOTIFY = {
    "reasoning": "Worth a look.",
    "should_notify": True,
    "urgency": "normal",
    "summary": "An issue changed.",
    "confidence": 0.9,
}


def test_exported_feedback_is_judged_with_the_pipeline_s_prompt(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    source = demo_config(demo_api)
    with FakeOpenAIServer(respond=lambda _request: Reply.verdict(NOTIFY)) as llm:
        watch = judged_watch(llm)
        sync(warehouse_url, source)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, watch, source, judge)
        # Updates too: their changed columns and old values are in the prompt as well.
        demo_api.tracker.mutate(update=6)
        sync(warehouse_url, source)
        with Judge(watch.judge) as judge:  # type: ignore[arg-type]
            evaluate(warehouse_url, watch, source, judge)
        pipeline = [request.messages for request in llm.requests]

        with connect(warehouse_url) as wh:
            rated = wh.fetch("SELECT notification_id, kind FROM outbox ORDER BY change_id")
            for notification_id, _kind in rated:
                record_feedback(wh, notification_id, "useful")
            exported = export_examples(wh, watch.name)
        assert {kind for _, kind in rated} == {"insert", "update"}
        # As a person would use it: written to an examples file, read back, scored by eval.
        path = tmp_path / "evals" / f"{watch.name}.yaml"
        path.parent.mkdir()
        path.write_text(examples_yaml(watch.name, exported))
        examples = load_examples(path)
        assert watch.judge is not None
        eval_set = EvalSet(watch.name, watch.name, watch.judge, examples)
        with ResultsWriter(tmp_path / "results.jsonl") as writer:
            assert run_eval([eval_set], [None], writer) == []
        again = [request.messages for request in llm.requests[len(pipeline) :]]

    # Every notification was judged once in the pipeline (the changes it did not notify about
    # were asked too); each is asked once again from its example, with the very same messages.
    assert len(again) == len(rated) == len(examples)
    for messages in again:
        assert messages in pipeline, messages[-1]["content"]
    updates = [m for m in again if "\nkind: update\n" in m[-1]["content"]]
    assert updates and all("changed columns: (not known)" not in m[-1]["content"] for m in updates)
