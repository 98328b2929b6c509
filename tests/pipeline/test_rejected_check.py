"""A skip source's rejected records show in Dagster: the no_rejected_records check warns until
the record is stored, on both backends; `changewatch sync` says so in its line."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from changewatch.pipeline.assets.rejected_records_check import REJECTED_CHECK
from changewatch.pipeline.assets.sync_assets import STORM_CHECK
from changewatch.pipeline.cli.command_line import summarize
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config

CONFIG = """\
version: 1
sources:
  - name: acme_items
    type: rest
    base_url: {url}
    path: items
    table: items
    primary_key: id
    on_bad_record: {policy}
    columns: {{id: bigint, score: bigint}}
"""


class Items:
    """A loopback API whose ``/items`` answers ``records`` as JSON (changed by the test)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        items = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps(items.records).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api() -> Iterator[Items]:
    items = Items()
    thread = threading.Thread(target=items.server.serve_forever, daemon=True)
    thread.start()
    yield items
    items.server.shutdown()
    items.server.server_close()


def materialize(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInJobResult:
    (asset,) = defs.assets  # type: ignore[misc]
    return dg.materialize([asset], resources=defs.resources, instance=instance)


def evaluations(result: dg.ExecuteInJobResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_the_check_warns_while_a_record_is_rejected(
    api: Items, warehouse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.records = records = [{"id": 1, "score": 1}, {"id": 2, "score": "lots"}]
    path = tmp_path / "watches.yaml"
    path.write_text(CONFIG.format(url=api.base_url, policy="skip"))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    defs = build_definitions(load_config(path))
    (asset,) = defs.assets  # type: ignore[misc]
    assert {key.name for key in asset.check_keys} == {STORM_CHECK, REJECTED_CHECK}
    with dg.instance_for_test() as instance:
        warned = materialize(defs, instance)
        check = evaluations(warned)[REJECTED_CHECK]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
        assert check.metadata["rejected_records"].value == 1
        assert check.description.startswith(
            '1 record(s) rejected by the last sync (the first: {"id": 2})'
        )
        (materialization,) = warned.asset_materializations_for_node("items")
        meta = {k: v.value for k, v in materialization.metadata.items()}
        assert "1 record(s) REJECTED and left out" in summarize("items", meta)
        records[1]["score"] = 2
        check = evaluations(materialize(defs, instance))[REJECTED_CHECK]
        assert check.passed and check.metadata["rejected_records"].value == 0


def test_a_fail_source_has_no_such_check_and_fails_its_run_by_record(
    api: Items, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.records = [{"id": 2, "score": "lots"}]
    path = tmp_path / "watches.yaml"
    path.write_text(CONFIG.format(url=api.base_url, policy="fail"))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'w.duckdb'}")
    defs = build_definitions(load_config(path))
    (asset,) = defs.assets  # type: ignore[misc]
    assert {key.name for key in asset.check_keys} == {STORM_CHECK}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset], resources=defs.resources, instance=instance, raise_on_error=False
        )
    [failure] = result.get_step_failure_events()
    assert "source 'acme_items': document 1 record #0 (key {'id': 2}): field 'score'" in (
        failure.step_failure_data.error.to_string()
    )
