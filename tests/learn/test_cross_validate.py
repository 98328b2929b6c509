"""`changewatch eval --cross-validate K`: the learned stage's table on an examples file."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from changewatch.evaluators.evals import EvalExample
from cw_testing import REPO
from openai_server import FakeOpenAIServer, Reply
from test_cli import run_cli
from test_learned_stage import CONDITION, LLM_VERDICT, _examples


def test_cross_validation_prints_stages_constants_and_a_curve(tmp_path: Path) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    examples = [e.model_dump(mode="json", exclude_none=True) for e in _examples(30)]
    file = tmp_path / "drops.yaml"
    file.write_text(yaml.safe_dump({"condition": CONDITION, "examples": examples}))
    done = run_cli(
        "eval", "--cross-validate", "3", "--examples", str(file), cwd=tmp_path, timeout=900,
        DAGSTER_HOME=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| examples | stage | train labels | precision | recall | F1 |")
    rows = [line.split(" | ") for line in lines[2:]]
    stages = [(row[1], row[2]) for row in rows]
    assert stages == [
        ("always-notify", "-"), ("always-skip", "-"),
        ("learned", "10"), ("cascade", "10"), ("learned", "20"), ("cascade", "20"),
    ]
    # Half the changes are big drops: always-notify's precision is 0.50, recall 1.00.
    assert rows[0][3:6] == ["0.50", "1.00", "0.67"]
    # With all 20 training labels the price diffs separate them: F1 well above the constant.
    assert float(rows[4][5]) >= 0.9, lines


def test_the_cascade_s_rest_goes_over_http_and_only_the_rest(tmp_path: Path) -> None:
    """`--model M --base-url URL`: every change the learned stage abstained on is one request
    to the served model at the wire; the changes it decided are never sent."""
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    # Price moves the stage can tell apart, and renames at the same price labelled both ways,
    # which it cannot: it has to leave those to the LLM.
    renames = [
        EvalExample(
            key=f"name-{i}", source="shop", old={"name": f"Product {i}", "price": 50.0},
            new={"name": f"Product {i} (new)", "price": 50.0},
            expect="notify" if i % 2 else "skip",
        )
        for i in range(8)
    ]
    examples = [
        e.model_dump(mode="json", exclude_none=True) for e in _examples(22) + renames
    ]
    file = tmp_path / "drops.yaml"
    file.write_text(yaml.safe_dump({"condition": CONDITION, "examples": examples}))
    notify = LLM_VERDICT | {"should_notify": True}
    with FakeOpenAIServer(respond=lambda _: Reply.verdict(notify)) as llm:
        done = run_cli(
            "eval", "--cross-validate", "3", "--examples", str(file), "--model", "served",
            "--base-url", llm.base_url, "--format", "json", cwd=tmp_path, timeout=900,
            DAGSTER_HOME=str(tmp_path),
        )
        requests = list(llm.requests)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    cascades = [row for row in rows if row["stage"] == "cascade"]
    assert [row["labels"] for row in cascades] == [10, 20]
    asked = sum(row["asked"] for row in cascades)
    # The stage decided some changes (with 20 labels the price diffs separate them) and sent
    # the others, one request each, with the served model's name and the condition; the LLM
    # alone was asked about every change once, and scores as always-notify (it says notify).
    assert 0 < asked < 2 * 30, cascades
    [alone] = [row for row in rows if row["stage"] == "llm-alone"]
    [notify] = [row for row in rows if row["stage"] == "always-notify"]
    assert (alone["asked"], alone["to_llm"]) == (30, 1.0)
    assert [alone[k] for k in ("precision", "recall", "f1")] == [
        notify[k] for k in ("precision", "recall", "f1")
    ]
    assert alone["llm_ms"] > 0
    assert len(requests) == asked + 30
    assert {r.body["model"] for r in requests} == {"served"}
    assert all(CONDITION in r.text for r in requests)
    for row in cascades:
        assert row["to_llm"] == row["asked"] / 30
        assert row["f1"] is not None  # the rest was answered: the cascade is scored whole
        assert row["llm_ms"] is None if row["asked"] == 0 else row["llm_ms"] > 0


def test_cross_validation_names_a_bad_k(tmp_path: Path) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    done = run_cli("eval", "--cross-validate", "1", cwd=tmp_path, DAGSTER_HOME=str(tmp_path))
    assert (done.returncode, done.stderr) == (
        2, "changewatch: --cross-validate needs K of at least 2 folds\n"
    )
