"""`changewatch explain`, `feedback` and `eval`, run as a user would, after a real sync.

The demo API serves the issues, a loopback OpenAI-compatible server is the model (it notifies
about issues labelled security), and the CLI runs in its own process each time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from changewatch.evaluators import local_model
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from openai_server import FakeOpenAIServer, Reply, Request, label_judge
from test_cli import REPO, run_cli

# Minutes of subprocesses: started first (see tests/conftest.py).
pytestmark = pytest.mark.heavy

security = label_judge("security")


def two_models(request: Request) -> Reply:
    """The watch's own model notices security issues; `eager` flags everything."""
    if request.body.get("model") == "eager":
        return Reply.verdict(
            {
                "reasoning": "Everything matters.",
                "should_notify": True,
                "urgency": "high",
                "summary": "Something changed.",
                "confidence": 0.9,
            }
        )
    return security(request)


@pytest.fixture
def world(tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str):
    with FakeOpenAIServer(respond=two_models) as llm:
        (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
        env = {
            "CHANGEWATCH_DEMO_URL": demo_api.url,
            "CHANGEWATCH_LLM_BASE_URL": llm.base_url,
            "CHANGEWATCH_LLM_MODEL": "watch-model",
            "CHANGEWATCH_WAREHOUSE_URL": warehouse_url,
            "DAGSTER_HOME": str(tmp_path),
        }
        (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        done = run_cli("sync", cwd=tmp_path, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        yield tmp_path, env, warehouse_url


@pytest.mark.e2e  # a dozen `changewatch` processes in a row
def test_explain_feedback_and_eval_from_the_command_line(world) -> None:
    cwd, env, url = world
    with connect(url) as wh:
        notified = wh.fetch(
            "SELECT notification_id, object_key FROM outbox WHERE watch = 'security_review'"
            " ORDER BY change_id"
        )
        (quiet,) = wh.fetch(
            "SELECT object_key FROM evaluations WHERE watch = 'security_review'"
            " AND decision = 'skip' LIMIT 1"
        )[0]
    assert len(notified) >= 2
    (first_id, first_key), (second_id, _) = notified[:2]

    done = run_cli("explain", "security_review", first_key, cwd=cwd, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"security_review: object {first_key}\n")
    assert "judge (watch-model, fresh call): notify, confidence 0.90" in done.stdout
    assert f"notified: {first_id}" in done.stdout
    assert "delivery to console: sent after 1 attempt(s)" in done.stdout
    # The prompt the model was sent, fenced.
    assert '    [user]\n    A change seen by the watch "security_review":\n' in done.stdout
    assert done.stdout.rstrip().endswith("    ```")
    done = run_cli("explain", "security_review", quiet, cwd=cwd, **env)
    assert "judge (watch-model, fresh call): no" in done.stdout

    assert run_cli("feedback", first_id, "useful", cwd=cwd, **env).stdout == (
        f"{first_id} (security_review): recorded as useful\n"
    )
    assert (
        run_cli("feedback", second_id, "noise", "--note", "old news", cwd=cwd, **env).returncode
        == 0
    )
    done = run_cli("feedback", "n-unknown", "useful", cwd=cwd, **env)
    assert (done.returncode, done.stderr.strip()) == (
        1,
        "changewatch: no notification 'n-unknown' in the outbox",
    )

    exported = run_cli("eval", "security_review", "--export-feedback", cwd=cwd, **env)
    assert exported.returncode == 0, exported.stderr
    examples = yaml.safe_load(exported.stdout)["examples"]
    assert [e["expect"] for e in examples] == ["notify", "skip"]
    # Plus one written by hand: a change nobody should hear about.
    examples.append({"kind": "insert", "new": {"title": "Dark mode"}, "expect": "skip"})
    (cwd / "evals").mkdir()
    (cwd / "evals" / "security_review.yaml").write_text(yaml.safe_dump({"examples": examples}))

    done = run_cli("eval", "security_review", "--model", "watch-model", "--model", "eager",
                   cwd=cwd, **env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("security_review: 3 example(s) from ")
    # The watch's model notified about the one rated noise; eager also about the dark mode.
    overall = [line.split()[:5] for line in lines if line.startswith("all ")]
    assert overall == [["all", "3", "0.50", "1.00", "0.67"], ["all", "3", "0.33", "1.00", "0.50"]]
    assert any("old news" in line and "expected skip, got notify" in line for line in lines)
    assert (cwd / ".changewatch" / "eval-results.jsonl").read_text().count("\n") == 6

    # Replay: the same condition is all cache and changes nothing; an edit is judged anew.
    done = run_cli("replay", "security_review", cwd=cwd, **env)
    assert done.returncode == 0, done.stderr
    assert " 0 added, 0 dropped, " in done.stdout and "nothing was sent" in done.stdout
    done = run_cli("replay", "security_review", "--where", "kind = 'delete'", cwd=cwd, **env)
    assert done.returncode == 0, done.stderr
    dropped = [line for line in done.stdout.splitlines() if line.startswith("- demo_issues ")]
    assert len(dropped) == len(notified)
    done = run_cli("replay", "security_review", "--where", "titel = 'x'", cwd=cwd, **env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("changewatch: watch 'security_review': where: ")

    done = run_cli("eval", "security_review", "--model", "eager", "--min-agreement", "0.9",
                   cwd=cwd, **env)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == "changewatch: model 'eager': agreement 0.33 is below 0.90"


def test_unknown_watch_or_a_watch_without_a_judge_is_one_line(tmp_path: Path) -> None:
    cwd, env = tmp_path, {"DAGSTER_HOME": str(tmp_path)}
    (cwd / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    done = run_cli("explain", "nope", "1", cwd=cwd, **env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("changewatch: no watch 'nope' in the watches file (known: ")
    done = run_cli("eval", "new_bugs", cwd=cwd, **env)
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "changewatch: watch 'new_bugs' has no judge: there is nothing to evaluate",
    )
    done = run_cli("eval", "security_review", cwd=cwd, **env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "evals/security_review.yaml: cannot read the examples file" in done.stderr


@pytest.mark.skipif(local_model.available(), reason="the [local] extra is installed")
def test_the_local_judge_without_its_extra_is_one_line(tmp_path: Path) -> None:
    cwd, env = tmp_path, {"DAGSTER_HOME": str(tmp_path)}
    (cwd / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    (cwd / "evals").mkdir()
    example = {"kind": "insert", "new": {"title": "Leaked token"}, "expect": "notify"}
    (cwd / "evals" / "security_review.yaml").write_text(yaml.safe_dump({"examples": [example]}))
    done = run_cli("eval", "security_review", "--model", "local", cwd=cwd, **env)
    assert (done.returncode, done.stderr) == (
        1,
        "changewatch: the local judge needs `pip install -e '.[local]'`\n",
    )


def test_eval_fails_when_the_model_never_answered(tmp_path: Path) -> None:
    import socket

    cwd = tmp_path
    (cwd / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    (cwd / "evals").mkdir()
    example = {"kind": "insert", "new": {"title": "Leaked token"}, "expect": "notify"}
    (cwd / "evals" / "security_review.yaml").write_text(yaml.safe_dump({"examples": [example]}))
    with socket.socket() as sock:  # bound, not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        env = {"DAGSTER_HOME": str(tmp_path), "CHANGEWATCH_LLM_BASE_URL": url}
        done = run_cli("eval", "security_review", cwd=cwd, **env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(
        f"changewatch: model 'llama3.2' at {url} never answered (1 example(s)): "
        "could not connect to the model server"
    ), done.stderr
