"""The benchmark still runs end to end (figures are its business, not this test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import patience
import pytest
from cw_testing import PG_URL, REPO

# The end-to-end tier (`pytest -m e2e`, run by .ci/run after the fast tier).
pytestmark = pytest.mark.e2e


def run_bench(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``argv`` (a bench script and its options) run from the repository root; it must exit 0."""
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


@pytest.mark.parametrize("server", ["process", "thread"])
def test_bench_sync_runs_on_a_small_listing(server: str) -> None:
    done = run_bench(["bench/bench_sync.py", "--rows", "3000", "--rounds", "1", "--server", server])
    assert "ratio first sync (bulk load) / fetch-only" in done.stdout
    assert "re-sync, 1k upd/100 del" in done.stdout
    # Each kind of sync's own peak RSS, at the row count asked for.
    assert "peak RSS first sync, 3,000 rows: " in done.stdout
    assert "peak RSS re-sync, 3,000 rows: " in done.stdout


def test_bench_notify_runs_on_both_backends() -> None:
    done = run_bench(["bench/bench_notify.py", *("--changes", "300", "--rounds", "1")])
    lines = done.stdout.splitlines()
    assert any(line.startswith("duckdb ") and line.split()[1] != "round" for line in lines)
    assert any(line.startswith("postgres ") and line.split()[1] != "round" for line in lines)
    assert "notifications/s" in done.stdout


def test_bench_probe_runs_on_a_few_sources() -> None:
    done = run_bench(["bench/bench_probe.py", *("--sources", "5", "--rounds", "1", "--no-sync")])
    assert "probe, 5 sources: " in done.stdout
    assert "per unchanged poll" in done.stdout


def test_bench_workspace_reload_rereads_a_small_code_location_both_ways() -> None:
    done = run_bench(
        ["bench/bench_workspace_reload.py"] + ["--sources", "3", "--reloads", "4", "--every", "2"]
    )
    lines = done.stdout.splitlines()
    # A row for the start and for every second re-read, with both clients' figures.
    rows = [line.split() for line in lines if line.split()[:1] in (["0"], ["2"], ["4"])]
    assert [row[0] for row in rows] == ["0", "2", "4"] and all(len(row) == 5 for row in rows)
    for name in ("glibc", "deploy"):
        assert f"{name}: RSS over the second half of the re-reads " in done.stdout
        assert any(line.startswith(f"  {name}: ") and "CPU s per re-read" in line for line in lines)


def test_bench_definitions_loads_the_code_location_for_a_few_sources() -> None:
    done = run_bench(
        ["bench/bench_definitions.py", "--sources", "2", "--rounds", "1"] + ["--snapshot"]
    )
    [row] = [line.split() for line in done.stdout.splitlines() if line.startswith("   this tree")]
    # sources, CPU per load, per source, RSS, code server start CPU, its RSS
    assert row[2] == "2" and float(row[3]) > 0 and float(row[6]) >= float(row[3]) * 0.5


def test_bench_run_cost_runs_a_few_sources_with_both_storages() -> None:
    done = run_bench(
        ["bench/bench_run_cost.py", "--sources", "4", "--changed", "2"] + ["--rounds", "1"]
    )
    rows = {
        line.split()[0]: line.split()[1:]
        for line in done.stdout.splitlines()
        if line.split()[:1] in (["pooled"], ["dagster"])
    }
    # core-s per run, ms per source, sessions opened
    assert set(rows) == {"pooled", "dagster"} and float(rows["pooled"][0]) > 0
    # The pooled storage keeps its connections: a run opens far fewer sessions.
    assert float(rows["pooled"][2]) * 5 < float(rows["dagster"][2])


def test_bench_batch_cost_runs_a_few_sources_each_way() -> None:
    done = run_bench(
        ["bench/bench_batch_cost.py", "--sources", "4", "--changed", "2"]
        + ["--polls", "1", "--rounds", "1", "--issues", "5"]
    )
    per_source = {
        line.split(":")[0]: float(line.split("per changed source ")[1].split()[0])
        for line in done.stdout.splitlines()
        if line.startswith(("batched run", "the same work alone"))
    }
    assert set(per_source) == {
        "batched run, a step per asset",
        "batched run, one step",
        "the same work alone",
    }
    assert all(v > 0 for v in per_source.values()), per_source
    # One step writes fewer Dagster events per changed source than a step per asset.
    events = {
        line.split(":")[0]: float(line.split(" Dagster events")[0].rsplit(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith("batched run")
    }
    assert events["batched run, one step"] < events["batched run, a step per asset"], events
    assert "issue 31's target:" in done.stdout


def test_bench_connect_opens_connections_every_way() -> None:
    done = run_bench(
        ["bench/bench_connect.py", "--tables", "0", "30", "--connections", "2"]
        + ["--pg-url", PG_URL]
    )
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    # tables, the way, CPU ms and wall ms per connection
    ways = ("per-connection", "shared-first", "shared-later", "builtin-first", "builtin-later")
    assert [row[:2] for row in rows] == [[t, way] for t in ("0", "30") for way in ways]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)


def bench_fleet(tmp_path: Path, *options: str) -> tuple[str, dict]:
    """bench_fleet on 3 targets polled every 20 s, each changing once a minute, a 30 s
    window, no baseline: its output and its one phase's figures."""
    figures_path = tmp_path / "figures.json"
    done = patience.run(
        [
            sys.executable,
            "bench/bench_fleet.py",
            *options,
            *("--sources", "3", "--interval", "20", "--minutes", "0.5"),
            *("--change-rate", "1", "--baseline-polls", "0", "--json", str(figures_path)),
        ],
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [figures] = json.loads(figures_path.read_text())
    return done.stdout, figures


@pytest.mark.heavy  # a real daemon and code server: a minute or two, started first
def test_bench_fleet_polls_a_few_sources_and_runs_only_for_changes(tmp_path) -> None:
    stdout, figures = bench_fleet(tmp_path)
    assert figures["label"] == "3 sources, tick 30 s"
    # The sensor probed during the window, and changes were made and each one notified.
    assert figures["probes"] > 0
    assert figures["changes"] > 0 and figures["missing"] == 0
    assert figures["notified_p95"] is not None
    # Runs only for changes: every sync followed a change of its source, every run came from
    # a probe (one source) or a batch of probed sources, none from the interval.
    assert figures["syncs_unchanged"] == 0 and figures["runs"] <= figures["changes"]
    assert set(figures["triggers"]) <= {"probe", "batch"}
    assert figures["runs_failed"] == 0 and figures["syncs_failed"] == 0
    assert figures["cpu"]["daemon"] > 0 and figures["cpu"]["code server"] > 0
    for line in (
        "core-s per poll, all included",
        "change->notification p50/p95/max s",
        "RSS peak MiB daemon / code / run",
        "RSS peak MiB by span: span",
    ):
        assert line in stdout
    # Memory is shown span by span (two halves of this short window), and judged flat or not.
    assert [len(span) for span in figures["rss_spans"]] == [2, 2]
    assert all(span["daemon"] > 0 for span in figures["rss_spans"])
    assert "memory over the window's second half: daemon " in stdout
    assert "TARGET" in stdout


@pytest.mark.heavy  # a real daemon and code server: a minute or two, started first
def test_bench_fleet_notifies_every_change_of_a_fleet_through_range_runs(tmp_path) -> None:
    # One fleet source of 3 targets under a live daemon: the fleet sensor probes each target
    # and asks one run over the partition range of those that changed, ticking every 10 s.
    _, figures = bench_fleet(tmp_path, "--shape", "fleet", "--tick", "10")
    assert figures["label"] == "3 fleet targets, tick 10 s"
    assert figures["bound_s"] == 20 + 19 + 10  # interval + jitter + tick
    # Every change made was notified (so its target's run ran), whenever in the phase.
    assert figures["changes"] > 0 and figures["missing"] == 0
    assert figures["runs_failed"] == 0 and figures["syncs_failed"] == 0
    assert set(figures["triggers"]) <= {"probe", "interval", "reconcile"}


def test_bench_big_values_syncs_a_large_value_on_both_backends() -> None:
    done = run_bench(
        ["bench/bench_big_values.py", *("--sizes", "2", "--shapes", "json")],
        env={"CHANGEWATCH_TEST_PG_URL": PG_URL},
    )
    lines = done.stdout.splitlines()
    assert any(line.startswith("duckdb ") and " MiB" in line for line in lines)
    assert any(line.startswith("postgres ") and " MiB" in line for line in lines)
