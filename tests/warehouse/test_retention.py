"""Retention on DuckDB and Postgres: old rows go, whatever a watch or a sync still needs stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from changewatch.evaluators.config import Watch
from changewatch.evaluators.evaluate import evaluate_watch
from changewatch.evaluators.filters import compile_filter
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.retention import RetentionConfig, prune
from changewatch.warehouse.sync import run_sync
from cw_testing import demo_source_settings

COLUMNS: dict[str, Any] = {
    "number": "bigint",
    "title": "text",
    "labels": {"type": "text[]", "path": "labels[].name"},
    "updated_at": "timestamp",
}
DAY = 86400


def evaluate(wh: Any, watch: Watch, source: RestSourceConfig) -> None:
    columns = {c: s.type for c, s in source.columns.items()}
    compiled = compile_filter(watch.where, watch=watch.name, columns=columns)
    evaluate_watch(wh, watch, {source.name: source}, {source.name: compiled})


def test_retention_keeps_what_watches_and_syncs_need(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = RestSourceConfig.model_validate(demo_source_settings(demo_api.url, COLUMNS))
    watches = [
        Watch(name="bugs", sources=["demo_issues"], where="'bug' IN labels", channels=[]),
        # Its notifications wait for channel "x": their content must stay.
        Watch(name="waiting", sources=["demo_issues"], where="number <= 5", channels=["x"]),
        # Fails on issue 3's values: that change is held, so it stays with its evaluation.
        Watch(
            name="odd",
            sources=["demo_issues"],
            where="CASE WHEN number = 3 THEN CAST(title AS integer) > 0 ELSE FALSE END",
            channels=[],
        ),
    ]
    retention = RetentionConfig(changes=DAY, sync_runs=DAY, notifications=DAY)
    names = {"demo_issues": [w.name for w in watches] + ["never_ran"]}
    later = datetime.now(UTC) + timedelta(days=2)
    with connect(warehouse_url) as wh:
        run_sync(wh, RestSource(source))
        for watch in watches:
            evaluate(wh, watch, source)
        demo_api.tracker.mutate(update=3)
        run_sync(wh, RestSource(source))  # changes 41-43: no watch has read them yet
        outbox_before = wh.fetch("SELECT count(*) FROM outbox")[0][0]

        # Nothing is old yet: a prune today removes nothing.
        assert sum(prune(wh, retention, [source], names).changes.values()) == 0

        stats = prune(wh, retention, [source], names, now=later)
        held = wh.fetch(
            "SELECT e.change_id FROM evaluations AS e WHERE e.decision = 'filter_error'"
        )
        kept = [row[0] for row in wh.fetch("SELECT change_id FROM issues_changes ORDER BY 1")]
        assert kept == [held[0][0], 41, 42, 43]
        assert stats.changes == {"demo_issues": 39}
        # The evaluations of the deleted changes; the held change keeps its three.
        assert stats.evaluations == 3 * 39
        assert wh.fetch("SELECT count(*) FROM evaluations")[0][0] == 3
        assert stats.sync_runs == 2 and wh.fetch("SELECT count(*) FROM sync_runs")[0][0] == 0
        # Every notification stays (its dedupe key); only finished ones lose their content.
        assert wh.fetch("SELECT count(*) FROM outbox")[0][0] == outbox_before
        cleared = wh.fetch("SELECT watch, count(*) FROM outbox WHERE payload = '{}' GROUP BY 1")
        assert cleared == [("bugs", stats.notifications_cleared)]
        assert wh.fetch("SELECT count(*) FROM outbox WHERE watch = 'waiting' AND title = ''") == [
            (0,)
        ]

        # Idempotent, and the watches and the next sync go on where they were.
        assert prune(wh, retention, [source], names, now=later).changes == {"demo_issues": 0}
        demo_api.tracker.mutate(update=1)
        sync = run_sync(wh, RestSource(source))
        ids = wh.fetch("SELECT change_id FROM issues_changes WHERE sync_id = $1", (sync.sync_id,))
        assert ids == [(44,)]  # numbered after the newest entry, which retention kept
        evaluate(wh, watches[0], source)
        new = "SELECT count(*) FROM evaluations WHERE watch = 'bugs' AND change_id > 40"
        assert wh.fetch(new) == [(4,)]  # the three it had not read, and the new one


def test_released_changes_stay_until_every_watch_has_evaluated_them(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    from changewatch.warehouse.sync import held_changes, release_changes

    settings = demo_source_settings(demo_api.url, COLUMNS, storm={"max_share": 0.2, "min_rows": 10})
    source = RestSourceConfig.model_validate(settings)
    watch = Watch(name="all", sources=["demo_issues"], where="TRUE", channels=[])
    retention = RetentionConfig(changes=DAY)
    names = {"demo_issues": ["all"]}
    later = datetime.now(UTC) + timedelta(days=2)
    with connect(warehouse_url) as wh:
        run_sync(wh, RestSource(source))
        evaluate(wh, watch, source)
        demo_api.tracker.mutate(update=20)
        assert run_sync(wh, RestSource(source)).storm_held
        assert held_changes(wh, source) == 20
        release_changes(wh, source)
        # Old by detection and by release, below the watermark, but not evaluated yet.
        prune(wh, retention, [source], names, now=later)
        assert wh.fetch("SELECT count(*) FROM issues_changes WHERE released_at IS NOT NULL") == [
            (20,)
        ]
        evaluate(wh, watch, source)
        prune(wh, retention, [source], names, now=later)
        # Evaluated: they go, but for the newest entry of the log.
        assert wh.fetch("SELECT count(*) FROM issues_changes") == [(1,)]


def test_a_digest_keeps_its_notifications_content_until_it_has_gone_out(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path
) -> None:
    from changewatch.channels.config import DigestConfig
    from changewatch.channels.outbox import send_digest_window

    source = RestSourceConfig.model_validate(demo_source_settings(demo_api.url, COLUMNS))
    watch = Watch(name="bugs", sources=["demo_issues"], where="'bug' IN labels", channels=[])
    digest = DigestConfig(name="daily", watches=["bugs"], output_dir=str(tmp_path))
    retention = RetentionConfig(notifications=DAY)
    later = datetime.now(UTC) + timedelta(days=2)

    def cleared(wh: Any) -> int:
        return prune(
            wh,
            retention,
            [source],
            {"demo_issues": ["bugs"]},
            digests={"daily": ["bugs"]},
            now=later,
        ).notifications_cleared

    with connect(warehouse_url) as wh:
        run_sync(wh, RestSource(source))
        evaluate(wh, watch, source)
        notified = wh.fetch("SELECT count(*) FROM outbox")[0][0]
        assert notified > 0
        assert cleared(wh) == 0  # the digest has not listed them yet
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        window = {"window_start": today, "window_end": today + timedelta(days=1)}
        window["now"] = lambda: today + timedelta(days=1, hours=1)  # the day has ended
        assert send_digest_window(wh, digest, None, **window).items == notified
        assert cleared(wh) == notified
        # The window was sent; sending it again is a no-op and lists nothing twice.
        assert send_digest_window(wh, digest, None, **window).status == "already_sent"


def test_cached_verdicts_go_after_their_age(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    from changewatch.evaluators.judge import Judge
    from openai_server import FakeOpenAIServer, label_judge

    source = RestSourceConfig.model_validate(demo_source_settings(demo_api.url, COLUMNS))
    with FakeOpenAIServer(respond=label_judge("security")) as llm:
        watch = Watch.model_validate(
            {
                "name": "judged",
                "sources": ["demo_issues"],
                "where": "kind = 'insert'",
                "judge": {
                    "condition": "The issue is about security.",
                    "model": "test-model",
                    "base_url": llm.base_url,
                    "max_retries": 0,
                },
            }
        )
        columns = {c: s.type for c, s in source.columns.items()}
        compiled = compile_filter(watch.where, watch=watch.name, columns=columns)
        with connect(warehouse_url) as wh, Judge(watch.judge) as judge:  # type: ignore[arg-type]
            run_sync(wh, RestSource(source))
            evaluate_watch(wh, watch, {source.name: source}, {source.name: compiled}, judge=judge)
            assert wh.fetch("SELECT count(*) FROM judge_cache") == [(40,)]
            assert wh.fetch("SELECT count(*) FROM judge_prompts") == [(40,)]
            retention = RetentionConfig(verdicts=DAY)
            assert prune(wh, retention, [source], {}).verdicts == 0  # not a day old yet
            later = datetime.now(UTC) + timedelta(days=2)
            assert prune(wh, retention, [source], {}, now=later).verdicts == 40
            assert wh.fetch("SELECT count(*) FROM judge_cache") == [(0,)]
            # The prompts that produced them go with them.
            assert wh.fetch("SELECT count(*) FROM judge_prompts") == [(0,)]
