"""The watches file: every mistake is reported with file, line and key, and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from changewatch.pipeline.project.watches_file import ConfigError, load_config

CONFIGS = Path(__file__).parent / "configs"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "line", "key", "why"),
    [
        (
            "unknown_key.yaml",
            10,
            "sources[0].paginatr",
            "unknown key 'paginatr'; did you mean 'paginator'?",
        ),
        ("wrong_type.yaml", 10, "sources[0].interval", "is not a duration"),
        (
            "missing_env.yaml",
            13,
            "sources[0].auth.token_env",
            "CW_TEST_SURELY_UNSET_TOKEN is not set",
        ),
        ("missing_url_env.yaml", 5, "sources[0].base_url", "CW_TEST_SURELY_UNSET_URL is not set"),
        ("bad_column_type.yaml", 10, "sources[0].columns.title.type", "Input should be"),
        (
            "missing_feedback_secret.yaml",
            12,
            "feedback.secret_env",
            "CW_TEST_SURELY_UNSET_FEEDBACK_SECRET (the feedback links' signing secret) is not set",
        ),
    ],
)
def test_mistakes_name_file_line_and_key(name: str, line: int, key: str, why: str) -> None:
    path = CONFIGS / name
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}:{line}: {key}: "), message
    assert why in message


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = tmp_path / "watches.yaml"
    text = (CONFIGS / "unknown_key.yaml").read_text().replace("version: 1", "version: one")
    path.write_text(text)
    lines = str(pytest.raises(ConfigError, load_config, path).value).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["version", "sources[0].paginatr"]


def test_duplicate_names_and_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    source = (CONFIGS / "wrong_type.yaml").read_text().split("sources:\n")[1]
    source = source.replace("interval: every now and then", "interval: 60")
    path.write_text("sources:\n" + source + source.replace("table: issues", "table: other"))
    with pytest.raises(ConfigError, match="two sources share the name 'demo_issues'"):
        load_config(path)
    path.write_text("sources:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: not valid YAML"):
        load_config(path)


def test_secret_values_are_refused_in_yaml() -> None:
    text = (CONFIGS / "missing_env.yaml").read_text()
    broken = text.replace("token_env: CW_TEST_SURELY_UNSET_TOKEN", "token_env: ghp_abc123secret")
    path = CONFIGS.parent / "configs" / "_tmp_secret.yaml"
    try:
        path.write_text(broken)
        with pytest.raises(ConfigError, match="not an environment variable name"):
            load_config(path)
    finally:
        path.unlink()


def test_bundled_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHANGEWATCH_DEMO_URL", raising=False)
    config = load_config(REPO / "watches.yaml")
    source = config.source("demo_issues")
    assert source.base_url == "http://127.0.0.1:8765"  # the ${...:-default}
    monkeypatch.setenv("CHANGEWATCH_DEMO_URL", "http://127.0.0.1:9999")
    assert load_config(REPO / "watches.yaml").source("demo_issues").base_url.endswith(":9999")


def test_bad_config_writes_nothing(tmp_path: Path) -> None:
    warehouse = tmp_path / "never.duckdb"
    env = dict(
        os.environ,
        CHANGEWATCH_CONFIG=str(CONFIGS / "unknown_key.yaml"),
        CHANGEWATCH_WAREHOUSE_URL=f"duckdb:///{warehouse}",
        DAGSTER_HOME=str(tmp_path),
    )
    done = subprocess.run(
        [sys.executable, "-m", "changewatch.pipeline.cli", "sync"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"{CONFIGS / 'unknown_key.yaml'}:10: sources[0].paginatr: unknown key" in done.stderr
    assert not warehouse.exists()
    assert not (tmp_path / "history").exists()  # no Dagster run was even recorded


def test_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    # The secrets the example names (its header says which); only their names are in the file.
    for name in ("GITHUB_TOKEN", "OPENAI_API_KEY", "SMTP_PASSWORD", "WEBHOOK_SECRET"):
        monkeypatch.setenv(name, "not-a-real-secret")
    config = load_config(REPO / "examples" / "github.yaml")
    assert [(s.name, s.type) for s in config.sources] == [
        ("dagster_issues", "github"),
        ("duckdb_issues", "rest"),
        ("status_incidents", "rest"),
        ("duckdb_releases", "feed"),
    ]
    assert config.source("dagster_issues").reconcile == "0 3 * * *"
    assert config.source("status_incidents").cron == "*/30 * * * *"
    assert [w.name for w in config.watches] == ["regressions", "new_duckdb_release"]
    assert [d.name for d in config.digests] == ["weekday_morning"]
    # A secret left unset is named, with the key that needs it.
    monkeypatch.delenv("WEBHOOK_SECRET")
    with pytest.raises(ConfigError, match=r"secret_env: environment variable WEBHOOK_SECRET"):
        load_config(REPO / "examples" / "github.yaml")


def test_validate_names_an_unset_webhook_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from changewatch.pipeline.cli.command_line import main

    path = tmp_path / "watches.yaml"
    text = (CONFIGS / "wrong_type.yaml").read_text().replace("every now and then", "60")
    hook = "    webhook: {path: /hooks/issues, secret_env: CW_TEST_UNSET_HOOK_SECRET}\n"
    path.write_text(text + hook)
    line = len(text.splitlines()) + 1
    monkeypatch.delenv("CW_TEST_UNSET_HOOK_SECRET", raising=False)
    # Only the receiver reads it: the code server, the daemon and the runs load the file.
    assert load_config(path).sources[0].webhook is not None
    assert main(["--config", str(path), "validate"]) == 2
    assert capsys.readouterr().err == (
        f"changewatch: {path}:{line}: sources[0].webhook.secret_env: environment variable "
        "CW_TEST_UNSET_HOOK_SECRET is not set (`changewatch webhooks` needs it)\n"
    )
    # A Standard Webhooks secret the receiver could not decode is named too (never shown).
    monkeypatch.setenv("CW_TEST_UNSET_HOOK_SECRET", "whsec_not*base64")
    assert main(["--config", str(path), "validate"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: sources[0].webhook.secret_env: environment variable" in err
    assert "is not base64" in err and "not*base64" not in err
    monkeypatch.setenv("CW_TEST_UNSET_HOOK_SECRET", "whsec_czNjcmV0")
    assert main(["--config", str(path), "validate"]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 source(s)")


def test_typos_get_the_nearest_name_and_unknown_names_the_known_ones(tmp_path: Path) -> None:
    from cw_testing import demo_source_settings

    columns = {"number": "bigint", "updated_at": "timestamp"}
    sources = [
        demo_source_settings("http://127.0.0.1:9", columns),
        demo_source_settings("http://127.0.0.1:9", columns, name="releases", table="releases"),
    ]
    path = tmp_path / "watches.yaml"

    def problems(data: dict) -> list[str]:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        message = str(pytest.raises(ConfigError, load_config, path).value)
        return [line.split(": ", 2)[2] for line in message.splitlines()]

    # Keys nested in unions (a source's type, its auth's type) and in dicts (a column's spec).
    typos = dict(sources[0], stop={"max_failure": 3}, auth={"type": "bearer", "tokn_env": "T"})
    typos["columns"] = {"number": {"type": "bigint", "pth": "id"}, "updated_at": "timestamp"}
    assert sorted(problems({"sources": [typos], "polling": {"tik": "1m"}, "retension": {}})) == [
        "Field required",  # auth.token_env
        "unknown key 'max_failure'; did you mean 'max_failures'?",
        "unknown key 'pth'; did you mean 'path'?",
        "unknown key 'retension'; did you mean 'retention'?",
        "unknown key 'tik'; did you mean 'tick'?",
        "unknown key 'tokn_env'; did you mean 'token_env'?",
    ]
    assert problems({"sources": sources, "frobnicate": 1}) == ["unknown key 'frobnicate'"]
    watch = {"name": "w", "sources": ["demo_isues", "nothing_like_it"], "channels": ["mail"]}
    assert problems({"sources": sources, "watches": [watch]}) == [
        "unknown source 'demo_isues'; did you mean 'demo_issues'? (known: demo_issues, releases)",
        "unknown source 'nothing_like_it' (known: demo_issues, releases)",
        "unknown channel 'mail' (known: none)",
    ]
