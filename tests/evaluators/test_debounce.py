"""Debounce on DuckDB and Postgres: a flap sends nothing, a change that stays is sent once,
after its window, and digests and `explain` tell the two apart."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from changewatch.channels.config import DigestConfig, FileChannelConfig
from changewatch.channels.outbox import deliver_due, send_digest_window
from changewatch.evaluators.config import Watch
from changewatch.evaluators.debounce import settle_debounced
from changewatch.evaluators.evaluate import evaluate_watch
from changewatch.evaluators.explain import explain_object, format_explanation
from changewatch.evaluators.filters import compile_filter
from changewatch.evaluators.replay import replay_watch
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync

WINDOW = timedelta(minutes=10)


class Items:
    """A loopback JSON API serving whatever ``records`` holds now."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        items = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(items.records).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Items:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def api() -> Iterator[Items]:
    with Items() as server:
        yield server


class Setup:
    """One source over ``api``, one debounced watch on state changes, one file channel."""

    def __init__(self, url: str, api: Items, tmp_path: Path) -> None:
        self.url, self.api = url, api
        self.source = RestSourceConfig.model_validate(
            {
                "name": "items",
                "type": "rest",
                "table": "items",
                "base_url": api.url,
                "path": "/items",
                "primary_key": "id",
                "columns": {"id": "bigint", "state": "text"},
            }
        )
        self.watch = Watch(
            name="state_changes",
            sources=["items"],
            where="changed(state) OR kind <> 'update'",
            channels=["out"],
            debounce="10m",
            title="#{{ key }} is {{ current.state or 'gone' }}",
        )
        self.filter = compile_filter(
            self.watch.where, watch=self.watch.name, columns={"id": "bigint", "state": "text"}
        )
        self.channel = FileChannelConfig(name="out", type="file", path=str(tmp_path / "out.jsonl"))

    def sync(self, **states: str) -> datetime:
        """Serve ``states`` (``_1="open"``: item 1, open), sync and evaluate; when detected."""
        self.api.records = [{"id": int(k[1:]), "state": v} for k, v in states.items()]
        with connect(self.url) as wh:
            run_sync(wh, RestSource(self.source))
            evaluate_watch(
                wh, self.watch, {"items": self.source}, {"items": self.filter}, judge=None
            )
            return wh.fetch("SELECT max(detected_at) FROM items_changes")[0][0]

    def deliver(self, at: datetime) -> tuple[int, int, int]:
        """One delivery pass at ``at``, as the notifications asset runs it."""
        with connect(self.url) as wh:
            settled = settle_debounced(wh, [self.watch], {"items": self.source}, now=lambda: at)
            sent = deliver_due(wh, [self.channel], now=lambda: at)
        return settled.released, settled.suppressed, sent.sent

    def sent(self) -> list[str]:
        path = Path(self.channel.path)
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line)["title"] for line in lines]

    def deliveries(self) -> list[tuple[str, str, str | None]]:
        with connect(self.url) as wh:
            return wh.fetch(
                "SELECT o.object_key, d.status, d.last_error FROM deliveries AS d "
                "JOIN outbox AS o USING (notification_id) ORDER BY o.change_id"
            )


def test_a_flap_sends_nothing_and_a_lasting_change_is_sent_once_after_its_window(
    warehouse_url: str, api: Items, tmp_path: Path
) -> None:
    s = Setup(warehouse_url, api, tmp_path)
    s.sync(_1="open", _2="open", _3="open")  # the silent baseline
    changed = s.sync(_1="closed", _2="closed", _3="open", _4="open")  # 1, 2 closed; 4 new
    back = s.sync(_1="open", _2="closed", _3="open")  # 1 reopened, 4 deleted: flapped back
    between = (back - changed) / 2  # the syncs' windows end this far apart

    # Inside the window nothing is settled or sent.
    assert s.deliver(changed + WINDOW / 2) == (0, 0, 0)
    assert s.sent() == []
    # Once the first changes' window has passed: 2 stays closed and goes out; 1's close is
    # superseded by its reopening, and 4's creation by its deletion, each within the window.
    assert s.deliver(changed + WINDOW + between) == (1, 2, 1)
    assert s.sent() == ["#2 is closed"]
    # The reopening and the deletion wait out their own window, then find 1 open and 4 gone,
    # as before the burst: suppressed, never sent.
    assert s.deliver(back + WINDOW + timedelta(seconds=1)) == (0, 2, 0)
    assert s.sent() == ["#2 is closed"]
    assert s.deliveries() == [
        ("1", "suppressed", f"superseded by change {_change(s, '1', 'open')} within 10m"),
        ("2", "sent", None),
        ("4", "suppressed", f"superseded by change {_change(s, '4', None)} within 10m"),
        ("1", "suppressed", "flapped back within 10m"),
        ("4", "suppressed", "flapped back within 10m"),
    ]
    # Later passes never resend, nor settle anything again.
    assert s.deliver(back + 2 * WINDOW) == (0, 0, 0)
    assert s.sent() == ["#2 is closed"]

    # The digest of the hour lists the change that stayed, not the flaps.
    digest = DigestConfig(name="hourly", watches=["state_changes"], output_dir=str(tmp_path))
    with connect(warehouse_url) as wh:
        result = send_digest_window(
            wh,
            digest,
            None,
            window_start=changed - timedelta(hours=1),
            window_end=changed + timedelta(hours=1),
            now=lambda: changed + timedelta(hours=2),
        )
        assert result.items == 1
        # `explain` and the decisions view say what happened to the flap.
        story = format_explanation(
            s.watch, "1", explain_object(wh, s.watch, {"items": s.source}, "1")
        )
        suppressed = wh.fetch(
            "SELECT object_key, suppressed FROM decisions WHERE suppressed IS NOT NULL "
            "ORDER BY change_id"
        )
    assert "suppressed (debounce): flapped back within 10m" in story
    assert [key for key, _ in suppressed] == ["1", "4", "1", "4"]

    # A replay of the same watch compares decisions, and its `sent` column says which
    # notification actually went out: only the change that stayed.
    with connect(warehouse_url) as wh:
        replay = replay_watch(wh, s.watch, {"items": s.source}, since=changed - WINDOW)
    assert replay.count("same") == replay.changes.height == 5
    sent = replay.changes.filter(pl.col("sent"))
    assert sent["object_key"].to_list() == ["2"]


def test_an_identical_change_after_a_flap_is_decided_on_the_latest(
    warehouse_url: str, api: Items, tmp_path: Path
) -> None:
    """Closed, reopened, closed again within the window: the net change is the close. Its
    dedupe key (the closed version) is the first close's, which the third change takes over."""
    s = Setup(warehouse_url, api, tmp_path)
    s.sync(_1="open")
    s.sync(_1="closed")
    s.sync(_1="open")
    last = s.sync(_1="closed")
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT count(*) FROM outbox")[0][0] == 2  # closed, open
    assert s.deliver(last + WINDOW + timedelta(seconds=1)) == (1, 1, 1)
    assert s.sent() == ["#1 is closed"]
    assert s.deliver(last + 2 * WINDOW) == (0, 0, 0)
    assert s.sent() == ["#1 is closed"]
    with connect(warehouse_url) as wh:
        story = format_explanation(
            s.watch, "1", explain_object(wh, s.watch, {"items": s.source}, "1")
        )
    # The first close tells who took its notification over; the last close shows the delivery.
    assert f"taken over by change {_change(s, '1', 'closed')}" in story
    assert story.count("delivery to out: sent") == 1


def test_a_change_coming_after_its_burst_was_sent_is_news_of_its_own(
    warehouse_url: str, api: Items, tmp_path: Path
) -> None:
    """Closed, and that sent, then reopened within what would have been the window (a late
    evaluation, say): the reopening is sent, since people were told it was closed."""
    s = Setup(warehouse_url, api, tmp_path)
    s.sync(_1="open")
    closed = s.sync(_1="closed")
    assert s.deliver(closed + WINDOW + timedelta(seconds=1)) == (1, 0, 1)
    reopened = s.sync(_1="open")
    assert reopened < closed + WINDOW
    assert s.deliver(reopened + WINDOW + timedelta(seconds=1)) == (1, 0, 1)
    assert s.sent() == ["#1 is closed", "#1 is open"]


def test_notifications_waiting_when_the_debounce_is_removed_are_released(
    warehouse_url: str, api: Items, tmp_path: Path
) -> None:
    s = Setup(warehouse_url, api, tmp_path)
    s.sync(_1="open")
    closed = s.sync(_1="closed")
    s.watch = s.watch.model_copy(update={"debounce": None})
    assert s.deliver(closed) == (1, 0, 1)
    assert s.sent() == ["#1 is closed"]


def _change(s: Setup, key: str, state: str | None) -> int:
    """The id of the last change that left item ``key`` in ``state`` (None: deleted)."""
    with connect(s.url) as wh:
        return wh.fetch(
            "SELECT max(change_id) FROM items_changes WHERE object_key = $1 "
            "AND new_state IS NOT DISTINCT FROM $2",
            (key, state),
        )[0][0]


def test_a_warehouse_of_an_older_release_gets_the_columns_and_the_new_view(
    warehouse_url: str,
) -> None:
    from changewatch.warehouse.schema import ensure_evaluation_tables

    with connect(warehouse_url) as wh:
        with wh.transaction():
            ensure_evaluation_tables(wh)
        # As a release before debounce left it: no outbox columns, a view without them.
        with wh.transaction():
            wh.execute("DROP VIEW decisions")
            for column in ("due_at", "settled_at", "suppressed"):
                wh.execute(f"ALTER TABLE outbox DROP COLUMN {column}")
            wh.execute("CREATE VIEW decisions AS SELECT e.watch, e.change_id FROM evaluations e")
    # The new release's process (this one remembers having created the tables on PostgreSQL:
    # warehouse/schema.py keeps a memo of the DDL it committed).
    upgrade = (
        "import sys\n"
        "from changewatch.warehouse import connect\n"
        "from changewatch.warehouse.schema import ensure_evaluation_tables\n"
        "with connect(sys.argv[1]) as wh, wh.transaction():\n"
        "    ensure_evaluation_tables(wh)\n"
    )
    subprocess.run([sys.executable, "-c", upgrade, warehouse_url], check=True)
    with connect(warehouse_url) as wh:
        columns = wh.fetch_frame("SELECT * FROM decisions").columns
        assert {"suppressed", "debounced_until", "notified_change_id", "delivery_status"} <= set(
            columns
        )
        assert {"due_at", "settled_at", "suppressed"} <= set(
            wh.fetch_frame("SELECT * FROM outbox").columns
        )
