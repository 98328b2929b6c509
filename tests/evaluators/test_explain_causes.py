"""`explain` names the one cause of a skip and marks smoke-test verdicts (issue 33, point 6)."""

from __future__ import annotations

from typing import Any

from changewatch.evaluators.config import Watch
from changewatch.evaluators.explain import _decision
from changewatch.evaluators.local_model import SMOKE_TEST_MARK

WATCH = Watch.model_validate(
    {
        "name": "outages",
        "sources": ["issues"],
        "where": "true",
        "judge": {"condition": "An outage.", "model": "m", "min_confidence": 0.7},
        "channels": ["console"],
    }
)


def _row(**values: Any) -> dict[str, Any]:
    row = {
        "decision": "skip",
        "passed_filter": True,
        "should_notify": False,
        "confidence": 0.9,
        "summary": "Issue 7 was renamed.",
        "reasoning": "Only a title.",
        "model": "m",
        "cache_hit": False,
    }
    return {**row, **values}


def test_a_skip_names_the_one_cause() -> None:
    said_no = _decision(WATCH, _row())
    assert said_no[-1] == "not notified: the judge said no"
    unsure = _decision(WATCH, _row(should_notify=True, confidence=0.6))
    assert unsure[-1] == (
        "not notified: the judge said notify at confidence 0.60, below the watch's "
        "min_confidence 0.70"
    )
    assert all("or was less sure" not in line for line in said_no + unsure)


def test_a_smoke_test_verdict_is_marked() -> None:
    smoke = _decision(WATCH, _row(model="local:x.gguf@0", summary=f"{SMOKE_TEST_MARK} Renamed."))
    assert smoke[1].startswith("[smoke test] judge (local:x.gguf@0, fresh call): no, ")
    assert _decision(WATCH, _row())[1].startswith("judge (m, fresh call): no, ")
