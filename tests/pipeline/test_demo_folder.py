"""What a folder holds after `changewatch demo`: the warehouse the other commands read, the
files it needs, and the same from a built wheel (not the source tree) in an empty folder."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from cw_testing import REPO
from patience import run
from test_cli import run_cli

SMALL_DEMO = ("--issues=12", "--create=1", "--update=2", "--delete=1")


@pytest.fixture
def no_llm() -> Iterator[str]:
    """An LLM endpoint that refuses connections at once: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def readme_sql_examples() -> list[str]:
    examples = re.findall(
        r'^\.venv/bin/changewatch sql "(.+)"$', (REPO / "README.md").read_text(), re.MULTILINE
    )
    assert len(examples) >= 4, "the README's SQL examples moved: update this test"
    return examples


@pytest.mark.e2e  # the whole demo (three passes), then a `changewatch sql` process per example
def test_readme_sql_examples_run_after_the_demo(tmp_path: Path, no_llm: str) -> None:
    # A fresh clone: the bundled watches.yaml and dagster.yaml, nothing else.
    for name in ("watches.yaml", "dagster.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    demo = run_cli("demo", *SMALL_DEMO, cwd=tmp_path, CHANGEWATCH_LLM_BASE_URL=no_llm)
    assert demo.returncode == 0, demo.stdout + demo.stderr

    outputs = []
    for query in [*readme_sql_examples(), "SELECT watch, title FROM outbox"]:
        done = run_cli("sql", query, cwd=tmp_path)
        assert done.returncode == 0, (query, done.stderr)
        outputs.append(done.stdout)
    # What the demo wrote: 12 issues, then 1 opened, 2 edited, 1 closed, 1 deleted.
    assert "shape: (5, 3)" in outputs[0]
    assert "shape: (17, 3)" in outputs[1]  # 12 + 1 + 2 + 1 + 1 changes
    # The closing reached the closed_issues watch, which told the console and the outbox.
    [closed] = re.findall(r"^demo API changed: .*, closed \[(\d+)\], ", demo.stdout, re.MULTILINE)
    assert f"Closed #{closed}: " in demo.stdout
    third = re.findall(r"^eval_closed_issues: .* (\d+) notified", demo.stdout, re.MULTILINE)[-1]
    assert int(third) >= 1
    assert re.search(rf"closed_issues\s*┆\s*Closed #{closed}: ", outputs[-1]), outputs[-1]
    assert "shape: (0," not in "".join(outputs)
    # The command the demo suggests is one of them, as is.
    assert "query it: changewatch sql 'SELECT watch, title FROM outbox'" in demo.stdout


def test_demo_keeps_a_warehouse_of_other_sources(tmp_path: Path) -> None:
    for name in ("watches.yaml", "dagster.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    database = tmp_path / ".changewatch" / "warehouse.duckdb"
    database.parent.mkdir()
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE sync_state (source TEXT PRIMARY KEY, table_name TEXT)")
        con.execute("INSERT INTO sync_state VALUES ('payroll', 'payroll')")
    before = database.read_bytes()
    refused = run_cli("demo", *SMALL_DEMO, cwd=tmp_path)
    assert refused.returncode == 2
    assert f"{database} holds data of other sources (payroll)" in refused.stderr
    assert database.read_bytes() == before


def build_wheel(destination: Path) -> Path:
    """A wheel built from a copy of the source tree (the build writes build/ and egg-info)."""
    source = destination / "src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".changewatch",
        ),
    )
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            str(source),
            "-w",
            str(destination),
        ]
    )
    assert built.returncode == 0, built.stderr
    [wheel] = destination.glob("changewatch-*.whl")
    return wheel


@pytest.mark.e2e  # builds and installs a wheel
def test_demo_runs_from_an_empty_folder_after_installing_the_wheel(
    tmp_path: Path, no_llm: str
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    # Only changewatch/ lands in site-packages: no generic `pipeline`, `sql`... packages.
    assert tops == {"changewatch", "changewatch-0.1.0.dist-info"}

    # The wheel's files alone, with the test venv's packages for its dependencies only.
    target = tmp_path / "site"
    installed = run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel]
    )
    assert installed.returncode == 0, installed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    environ["CHANGEWATCH_LLM_BASE_URL"] = no_llm
    path = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])
    done = run(
        # -I -S: neither the current folder nor the editable install's .pth finder can reach
        # the source tree; this also ignores PYTHONPATH, so the paths come in through -c.
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            "import sys; sys.path[:0] = sys.argv[1].split(sys.argv[2]); "
            "import changewatch.pipeline.cli.command_line as cli; "
            "assert cli.__file__.startswith(sys.argv[3]), cli.__file__; "
            "raise SystemExit(cli.main(sys.argv[4:]))",
            path,
            os.pathsep,
            str(target),
            "demo",
            *SMALL_DEMO,
        ],
        cwd=empty,
        env=environ,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # It wrote its config and instance settings, then told the whole story.
    assert (empty / "watches.yaml").read_text() == (REPO / "watches.yaml").read_text()
    assert (empty / "dagster.yaml").read_text() == (REPO / "dagster.yaml").read_text()
    assert (
        f"dagster instance: {empty}  warehouse: {empty / '.changewatch' / 'warehouse.duckdb'}"
        in (done.stdout)
    )
    assert "digest_daily: written" in done.stdout
    with duckdb.connect(str(empty / ".changewatch" / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM issues").fetchone() == (12,)
    command = "DAGSTER_HOME=$PWD dagster dev -m changewatch.pipeline.definitions.code_location"
    assert command in done.stdout


def test_shipped_demo_files_are_the_repositorys() -> None:
    for name in ("watches.yaml", "dagster.yaml"):
        shipped = REPO / "pipeline" / "cli" / "demo_files" / name
        assert shipped.read_text() == (REPO / name).read_text(), f"copy {name} to {shipped}"
