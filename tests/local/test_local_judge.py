"""The offline judge against the real model: llama.cpp on the bundled SmolLM2-135M-Instruct.

Collected only where the `[local]` extra is installed (tests/conftest.py). What a 135M model
answers is not asserted, only that its answers have the verdict's shape, are repeated for the
same change (greedy decoding) and flow through the same paths as a remote model's: the
evaluation, the verdict cache, replay and the eval harness.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from changewatch.evaluators import local_model
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.judge import ChangeForJudge, Judge, Verdict
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import DEFAULT_URL, connect
from changewatch.warehouse.urls import duckdb_path
from cw_testing import REPO
from test_cli import evaluations, run_cli

# Where nothing listens: `model: local` must not use the configured endpoint.
NOWHERE = "http://127.0.0.1:9/v1"
# A verdict takes seconds of CPU (tens on a busy 2-core machine): CLI runs get time for it.
SLOW = 900


def test_a_local_verdict_has_the_schema_and_repeats() -> None:
    config = JudgeConfig(
        condition="The issue reports a security vulnerability.",
        model="local",
        base_url=NOWHERE,
        api_key_env="CW_TEST_UNSET_LLM_KEY",  # the local model needs no key
    )
    change = ChangeForJudge(
        watch="w",
        source="demo_issues",
        kind="insert",
        object_key="7",
        old=None,
        new={"title": "SQL injection in the login form", "labels": ["bug"]},
        changed_columns=None,
    )
    with Judge(config) as judge:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", judge.url), judge.url
        first, second = judge.evaluate(change), judge.evaluate(change)
    assert first.error is None and first.verdict is not None, first.error
    verdict = first.verdict
    assert Verdict.model_validate(verdict.model_dump()) == verdict
    assert isinstance(verdict.should_notify, bool) and 0 <= verdict.confidence <= 1
    assert verdict.reasoning.strip() and verdict.summary.strip()
    assert (first.model, first.attempts) == (local_model.identity(), 1)
    assert first.model.startswith("local:SmolLM2-135M-Instruct.Q4_1.gguf@")
    assert first.prompt_tokens > 100 and first.completion_tokens > 5
    # Temperature 0: the same change, the same verdict and the same tokens.
    assert second.verdict == verdict
    assert (second.prompt_tokens, second.completion_tokens) == (
        first.prompt_tokens,
        first.completion_tokens,
    )


def test_a_judged_watch_runs_offline_and_its_verdicts_are_cached(tmp_path: Path) -> None:
    for name in ("watches.yaml", "dagster.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    with DemoAPIServer(DemoTracker(issues=2, seed=7)) as api:
        env = {
            "CHANGEWATCH_DEMO_URL": api.url,
            "CHANGEWATCH_LLM_MODEL": "local",
            "CHANGEWATCH_LLM_BASE_URL": NOWHERE,
            "DAGSTER_HOME": str(tmp_path),
        }
        done = run_cli("sync", cwd=tmp_path, timeout=SLOW, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    review = evaluations(done.stdout)["security_review"]
    # Two new issues, two fresh verdicts, none held.
    assert (review["passed"], review["judged"], review["cached"], review["held"]) == (2, 2, 0, 0)

    url = f"duckdb:///{tmp_path / '.changewatch' / 'warehouse.duckdb'}"
    with connect(url) as wh:
        rows = wh.fetch(
            "SELECT decision, should_notify, reasoning, confidence, model, cache_hit,"
            " completion_tokens FROM evaluations WHERE watch = 'security_review'"
        )
    assert len(rows) == 2
    for decision, notify, reasoning, confidence, model, cache_hit, tokens in rows:
        assert decision in ("notify", "skip") and isinstance(notify, bool)
        assert reasoning.strip() and 0 <= confidence <= 1
        assert (model, cache_hit) == (local_model.identity(), False) and tokens > 0

    # Replaying the same watch meets the same changes again: both verdicts come from the
    # cache, no call goes to the model ("0 judged"), and every decision stays as it was.
    done = run_cli("replay", "security_review", cwd=tmp_path, timeout=SLOW, **env)
    assert done.returncode == 0, done.stderr
    assert ", 2 passed the filter, 0 judged (2 cached); 0 added, 0 dropped, 2 unchanged" in (
        done.stdout
    )

    # Another GGUF file (here a copy under another name) is another model: its verdicts are
    # its own, none is taken from the cache of the first.
    other = tmp_path / "other.gguf"
    other.write_bytes(local_model.model_path().read_bytes())
    done = run_cli(
        "replay", "security_review", cwd=tmp_path, timeout=SLOW,
        **{**env, local_model.MODEL_ENV: str(other)},
    )
    assert done.returncode == 0, done.stderr
    assert ", 2 passed the filter, 2 judged (0 cached)" in done.stdout

    # The eval harness scores the local model like any other.
    examples = [
        {"kind": "insert", "new": {"title": "Password reset leaks tokens"}, "expect": "notify"},
        {"kind": "insert", "new": {"title": "Dark mode colours look wrong"}, "expect": "skip"},
    ]
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "security_review.yaml").write_text(yaml.safe_dump({"examples": examples}))
    done = run_cli("eval", "security_review", "--model", "local", cwd=tmp_path, timeout=SLOW, **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("security_review: 2 example(s) from ")
    assert "model local:SmolLM2-135M-Instruct.Q4_1.gguf@" in done.stdout
    (overall,) = [line.split() for line in lines if line.startswith("all ")]
    name, count, *_, p50, p95, tokens, calls = overall
    assert (name, count) == ("all", "2")
    assert int(calls) >= 2 and int(tokens) > 200 and 0 < int(p50) <= int(p95)


def test_the_demo_judges_with_the_local_model(tmp_path: Path) -> None:
    args = ("--issues=2", "--create=0", "--update=1", "--delete=0")
    done = run_cli("demo", *args, cwd=tmp_path, timeout=SLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "judge of security_review: the local model (SmolLM2-135M-Instruct.Q4_1, in this "
        "process: no key, no network)\n   a SMOKE TEST, not a judge: "
    ) in done.stdout
    assert "score it first: changewatch eval --model llama3.2 --base-url " in done.stdout
    rounds = done.stdout.split("\n== ")[1:4]
    review = evaluations(rounds[0])["security_review"]
    assert (review["judged"], review["held"]) == (2, 0)
    assert "are held" not in done.stdout
    # What it notified says it is a smoke test's, not a judgement.
    with connect(f"duckdb:///{tmp_path / duckdb_path(DEFAULT_URL)}") as wh:
        summaries = [row[0] for row in wh.fetch("SELECT summary FROM judge_cache")]
    assert summaries and all(s.startswith(local_model.SMOKE_TEST_MARK) for s in summaries)


def test_bench_local_judge_runs() -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_local_judge.py", "--changes", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "latency per verdict over 1: p50 " in done.stdout
    assert "without a verdict: 0 of 2" in done.stdout


def outage(body: str) -> ChangeForJudge:
    return ChangeForJudge(
        watch="w",
        source="demo_issues",
        kind="insert",
        object_key="4306",
        old=None,
        new={"title": "Primary database down in production", "labels": ["bug"], "body": body},
        changed_columns=None,
    )


def test_oversized_changes_fit_the_context_and_hold_up_no_other() -> None:
    config = JudgeConfig(
        condition="The issue reports a production outage.", model="local", base_url=NOWHERE
    )
    body = "The primary is unreachable since 09:12. " + "Connection refused. " * 2500  # 50 KB
    with Judge(config) as judge:
        # Three changes far over the 4,096 tokens, then an ordinary one: each gets a verdict.
        outcomes = [judge.evaluate(outage(body + str(i))) for i in range(3)]
        outcomes.append(judge.evaluate(outage("pg-primary-1 is unreachable; every page is 500.")))
    for outcome in outcomes:
        assert outcome.verdict is not None, outcome.error
        assert outcome.attempts >= 1 and outcome.prompt_tokens > 0
    for outcome in outcomes[:3]:
        # Counted with the model's own tokenizer: each request within its context.
        assert outcome.prompt_tokens <= outcome.attempts * local_model.CONTEXT
        assert outcome.verdict.reasoning.startswith(  # type: ignore[union-attr]
            "[Cut to fit the model's context of 4096 tokens: new.body cut from "
        )
    assert not outcomes[3].verdict.reasoning.startswith("[Cut")  # type: ignore[union-attr]


def test_the_token_count_is_the_model_s() -> None:
    text = "Primary database down in production"
    assert 0 < local_model.count_tokens(text) < len(text)
    assert local_model.count_tokens(text * 10) >= 10 * (local_model.count_tokens(text) - 1)


def test_the_build_is_portable() -> None:
    """llama.cpp built for the build machine's CPU (-march=native) killed the first verdict
    with SIGILL on a VM that masks AMX: CI builds it with GGML_NATIVE=OFF, which compiles in
    the AVX2 generation's instructions at most."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    used = set(re.findall(r"(\w+) = 1", info))
    assert not {f for f in used if f.startswith(("AVX512", "AMX", "AVX_VNNI"))}, info


def test_bench_judge_models_runs() -> None:
    """One example per file and split: the tune-then-test path, not the figures."""
    done = subprocess.run(
        [sys.executable, "bench/bench_judge_models.py", "--limit", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)\n  tune: condition only: F1 " in done.stdout
    assert "  test (4 examples): precision " in done.stdout and "(load average " in done.stdout
