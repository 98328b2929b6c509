"""Normalizing while the walk goes on gives exactly what one pass over the whole fetch gives."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from datetime import UTC, datetime

import orjson
import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.normalize import normalize_batch, normalize_with_fields
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.sources.stream import BATCH_BYTES, MAX_QUEUED, StreamingNormalizer
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from polars.testing import assert_frame_equal

SYNCED_AT = datetime(2026, 2, 1, tzinfo=UTC)


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


def source() -> SourceBase:
    return SourceBase.model_validate(
        {
            "name": "s",
            "type": "rest",
            "table": "items",
            "primary_key": "id",
            "updated_at": "updated_at",
            "columns": {"id": "bigint", "title": "text", "updated_at": "timestamp"},
        }
    )


def page(first: int, count: int, **extra: object) -> bytes:
    return orjson.dumps(
        [
            {"id": i, "title": f"item {i}", "updated_at": f"2026-01-01T00:00:{i % 60:02d}Z"} | extra
            for i in range(first, first + count)
        ]
    )


def streamed(documents: list[bytes], *, batch_bytes: int, known: list[str] | None = None) -> tuple:
    fetched = FetchResult(documents=documents)
    with StreamingNormalizer(source(), known_fields=known, batch_bytes=batch_bytes) as pages:
        for document in documents:
            pages.add(document, None)
        staged, fields = pages.finish(fetched, synced_at=SYNCED_AT)
        return staged.frame(), fields


@pytest.mark.parametrize("pages_per_batch", [1, 2, 100], ids=["worker", "mixed", "last only"])
def test_batches_give_the_one_pass_result(pages_per_batch: int) -> None:
    # An object that moved between pages (id 5 again, newer, on the last page) is one row,
    # its newest version, even when its copies fall into different batches.
    moved = orjson.dumps(
        [{"id": 5, "title": "item 5, edited", "updated_at": "2026-01-02T00:00:00Z"}]
    )
    documents = [page(0, 10), page(10, 10), page(20, 10), moved]
    whole, whole_fields = normalize_with_fields(
        FetchResult(documents=documents), source(), synced_at=SYNCED_AT, known_fields=["id"]
    )
    # Full batches go to the worker; what is left when the walk ends is done on this thread.
    size = pages_per_batch * len(documents[0])
    frame, fields = streamed(documents, batch_bytes=size, known=["id"])
    assert frame.height == 30
    assert frame.filter(frame["id"] == 5)["title"].to_list() == ["item 5, edited"]
    assert_frame_equal(frame, whole)
    assert fields == whole_fields


def test_rows_that_match_their_stored_version_are_staged_without_payload() -> None:
    # With the stored keys and hashes loaded first, a row whose content and payload are the
    # stored ones keeps its key and updated-at only: an unchanged re-sync stages a few bytes
    # a row, not its payloads. Changed content, a changed undeclared field, a new key: whole.
    stored = normalize_batch([page(0, 4)], None, source()).frame
    records = orjson.loads(page(0, 5))
    records[1]["title"] = "edited"
    records[2]["note"] = "new"
    # Met again later in the walk: 0 edited since (its newest copy is whole), 3 as it was.
    again = [records[0] | {"title": "edited", "updated_at": "2026-01-02T00:00:00Z"}, records[3]]
    with StreamingNormalizer(source(), batch_bytes=1) as pages:
        pages.stage.load_stored(stored.select("id", "_content_hash", "_raw_hash").to_arrow())
        pages.add(orjson.dumps(records), None)
        pages.add(orjson.dumps(again), None)
        staged, _ = pages.finish(FetchResult(documents=[], streamed=2), synced_at=SYNCED_AT)
        frame = staged.frame().sort("id")
    rows = frame.select("id", *(frame[c].is_not_null() for c in ("_raw", "title", "updated_at")))
    whole, slim = (True, True, True), (False, False, True)
    assert rows.rows() == [(0, *whole), (1, *whole), (2, *whole), (3, *slim), (4, *whole)]
    assert frame["title"][0] == "edited"


def test_stored_keys_load_beside_the_walk_and_batches_staged_before_are_whole() -> None:
    # A snapshot sync starts its walk while the stored keys and hashes load: the call returns
    # at once, and a batch normalized meanwhile does not wait. Staged before the keys are in,
    # unchanged rows are whole; after, they are their key alone. finish waits for the load.
    stored = normalize_batch([page(0, 8)], None, source()).frame
    released = threading.Event()
    with StreamingNormalizer(source(), batch_bytes=1) as pages:

        def load() -> None:
            released.wait(timeout=30)
            pages.stage.load_stored(stored.select("id", "_content_hash", "_raw_hash").to_arrow())

        pages.stage.load_stored_aside(load)
        pages.add(page(0, 4), None)  # a full batch: the worker stages it, without waiting
        deadline = time.monotonic() + 30
        with pages.stage.connection.cursor() as cursor:  # the worker has the connection
            while cursor.execute("SELECT count(*) FROM fetched").fetchall()[0][0] < 4:
                assert time.monotonic() < deadline, "the batch waited for the stored keys"
                time.sleep(0.01)
        assert not pages.stage.has_stored
        released.set()
        pages.stage.wait_stored()
        pages.add(page(4, 4), None)
        staged, _ = pages.finish(FetchResult(documents=[], streamed=2), synced_at=SYNCED_AT)
        assert staged.has_stored
        frame = staged.frame().sort("id")
    assert frame["_raw"].is_null().to_list() == [False] * 4 + [True] * 4


def test_a_failed_load_of_the_stored_keys_fails_the_walk() -> None:
    def load() -> None:
        raise RuntimeError("the warehouse went away")

    with StreamingNormalizer(source(), batch_bytes=1) as pages:
        pages.stage.load_stored_aside(load)
        with pytest.raises(RuntimeError, match="went away"):
            pages.add(page(0, 4), None)
            pages.finish(FetchResult(documents=[], streamed=1), synced_at=SYNCED_AT)


def test_field_types_come_from_the_first_non_null_value_over_all_batches() -> None:
    documents = [page(0, 3, score=None), page(3, 3, score=7), page(6, 3, score="high")]
    _, fields = streamed(documents, batch_bytes=1, known=["id", "title", "updated_at"])
    assert fields["score"] == "bigint"
    assert fields["id"] is None  # known: not worked out
    _, only_nulls = streamed([page(0, 3, extra=None)], batch_bytes=1, known=["id"])
    assert only_nulls["extra"] == "text"


def test_a_bad_record_in_a_later_batch_is_named_by_its_place_in_the_whole_fetch() -> None:
    bad = orjson.dumps([{"id": "seven", "updated_at": "2026-01-01T00:00:00Z"}])
    with pytest.raises(PayloadError, match="document 3 record #0"):
        streamed([page(0, 5), page(5, 5), bad], batch_bytes=1)
    # The first bad record is reported even when a later one fails first (the last batch,
    # normalized after the walk, can finish before the worker's batch).
    worse = orjson.dumps([{"title": "no key", "updated_at": "2026-01-01T00:00:00Z"}])
    with pytest.raises(PayloadError, match="document 1 record #0"):
        streamed([bad, page(0, 5), worse], batch_bytes=len(bad) + len(page(0, 5)))


def test_batches_the_worker_has_not_started_are_shared_when_the_walk_ends() -> None:
    # Forty one-page batches queue up at once: the worker takes them from the front while
    # this thread takes them from the back. Whoever did which, the result is the one pass's,
    # and the first bad record (an early batch) is the one reported, not a later one.
    documents = [page(10 * n, 10) for n in range(40)]
    whole = normalize_with_fields(
        FetchResult(documents=documents), source(), synced_at=SYNCED_AT, known_fields=["id"]
    )
    assert_frame_equal(streamed(documents, batch_bytes=1, known=["id"])[0], whole[0])
    bad = orjson.dumps([{"id": "seven", "updated_at": "2026-01-01T00:00:00Z"}])
    worse = orjson.dumps([{"title": "no key", "updated_at": "2026-01-01T00:00:00Z"}])
    with pytest.raises(PayloadError, match="document 3 record #0"):
        streamed([*documents[:2], bad, *documents[2:], worse], batch_bytes=1)


def test_a_source_that_ignores_the_sink_is_normalized_from_its_result() -> None:
    documents = [page(0, 10), page(10, 10)]
    with StreamingNormalizer(source()) as pages:
        staged, _ = pages.finish(FetchResult(documents=documents), synced_at=SYNCED_AT)
        assert staged.frame()["id"].to_list() == list(range(20))


def test_the_rest_source_hands_every_page_to_the_sink_once(demo_api) -> None:
    config = RestSourceConfig.model_validate(
        {
            "name": "demo",
            "type": "rest",
            "table": "issues",
            "base_url": demo_api.url,
            "path": "/repos/acme/widgets/issues",
            "params": {"state": "all", "per_page": 7},
            "paginator": {"type": "link_header"},
            "primary_key": "number",
            "columns": {"number": "bigint", "title": "text"},
        }
    )
    seen: list[bytes] = []
    fetched = RestSource(config).fetch(cursor=None, sink=lambda doc, path: seen.append(doc))
    assert len(seen) == fetched.pages > 1
    # Handed over, not kept: the walk holds no page the sink has let go of.
    assert fetched.documents == [] and fetched.streamed == len(seen)
    numbers = [issue["number"] for doc in seen for issue in json.loads(doc)]
    assert sorted(numbers) == list(range(1, 41))  # every issue, once


def test_a_connector_that_missed_its_sink_for_some_pages_is_an_error_not_a_guess() -> None:
    with StreamingNormalizer(source()) as pages:
        pages.add(page(0, 5), None)
        with pytest.raises(RuntimeError, match="passed 1 documents to its sink but returned 2"):
            pages.finish(FetchResult(documents=[page(0, 5), page(5, 5)]), synced_at=SYNCED_AT)


def test_a_bad_page_ends_the_walk_at_a_following_page() -> None:
    bad = orjson.dumps([{"id": "seven", "updated_at": "2026-01-01T00:00:00Z"}])
    added = 0
    with StreamingNormalizer(source(), batch_bytes=1) as pages:
        pages.add(bad, None)
        with pytest.raises(PayloadError, match="document 1 record #0"):
            for first in range(0, 5000, 5):  # the worker reports within a few pages
                pages.add(page(first, 5), None)
                added += 1
                time.sleep(0.01)
    assert added < 1000


def test_the_worker_starts_on_a_smaller_first_batch() -> None:
    # The first pages are normalized once they reach first_batch_bytes, while the walk goes
    # on towards full-size batches: the worker does not idle through the first batch_bytes.
    first = page(0, 50)
    with StreamingNormalizer(
        source(), batch_bytes=100 * len(first), first_batch_bytes=len(first)
    ) as pages:
        # A cursor of its own: the worker uses the stage's connection meanwhile.
        with pages.stage.connection.cursor() as cursor:

            def stored() -> int:
                return cursor.execute("SELECT count(*) FROM fetched").fetchall()[0][0]

            pages.add(first, None)
            deadline = time.monotonic() + 10
            while not stored():
                assert time.monotonic() < deadline, "the first page was never normalized"
                time.sleep(0.01)
            pages.add(page(50, 50), None)  # below batch_bytes: waits for a batch or the end
            time.sleep(0.2)
            assert stored() == 50
        staged, _ = pages.finish(FetchResult(documents=[], streamed=2), synced_at=SYNCED_AT)
        assert staged.height == 100


def one_page_batches(
    documents: list[bytes], max_queued: int
) -> tuple[StreamingNormalizer, list[int]]:
    """``documents`` streamed one page a batch with at most ``max_queued`` batches queued:
    the normalizer (closed, its counters kept) and the ids it staged, in arrival order."""
    with StreamingNormalizer(source(), batch_bytes=1, max_queued=max_queued) as pages:
        for document in documents:
            pages.add(document, None)
        fetched = FetchResult(documents=[], streamed=len(documents))
        staged, _ = pages.finish(fetched, synced_at=SYNCED_AT)
        return pages, staged.frame()["id"].to_list()


def test_the_walk_waits_for_the_worker_so_the_pages_held_stay_a_few_batches() -> None:
    # One page per batch and at most two batches queued: whatever the worker's pace, the
    # normalizer never holds more than the queued batches and the page being batched.
    pages, ids = one_page_batches([page(10 * n, 10) for n in range(200)], max_queued=2)
    assert pages.peak_holding <= 3
    assert ids == list(range(2000))


def test_the_walk_normalizes_batches_itself_while_the_worker_is_behind() -> None:
    # Pages arrive far faster than one thread normalizes them: rather than wait, the walk
    # takes the newest queued batch the worker has not started. Same rows, same bound on the
    # pages held, and a bad record is still reported by its place in the fetch.
    documents = [page(10 * n, 10) for n in range(200)]
    pages, ids = one_page_batches(documents, max_queued=3)
    assert pages.taken_over > 0
    assert pages.peak_holding <= 4
    assert ids == list(range(2000))
    bad = orjson.dumps([{"id": "seven", "updated_at": "2026-01-01T00:00:00Z"}])
    with pytest.raises(PayloadError, match="document 151 record #0"):
        one_page_batches([*documents[:150], bad, *documents[150:]], max_queued=3)


@pytest.mark.e2e  # a stress test: 67 MB of pages synced twice under tracemalloc (8-9 CPU-s)
def test_a_sync_holds_a_few_batches_of_pages_not_the_whole_fetch(
    warehouse_url: str, api: ApiServer
) -> None:
    # 350 pages of 100 GitHub-sized records (about 2 KB each): 67 MB of pages, against the
    # 4 MiB batches of which a sync keeps at most MAX_QUEUED plus the one being filled.
    pages, per_page = 350, 100
    body = "lorem ipsum " * 160

    def listing(request: Received) -> Reply:
        number = int(request.query.get("page", "1"))
        first = (number - 1) * per_page
        records = [
            {"id": i, "title": f"item {i}", "body": body, "updated_at": "2026-01-01T00:00:00Z"}
            for i in range(first, first + per_page)
        ]
        reply = Reply.json(records)
        if number < pages:
            reply.headers["Link"] = f'<{api.url("/items")}?page={number + 1}>; rel="next"'
        return reply

    api.route("/items", listing)
    config = RestSourceConfig.model_validate(
        {
            "name": "big",
            "type": "rest",
            "table": "big_items",
            "base_url": api.base_url,
            "path": "/items",
            "paginator": {"type": "link_header"},
            "primary_key": "id",
            "updated_at": "updated_at",
            "columns": {"id": "bigint", "title": "text", "body": "text", "updated_at": "timestamp"},
        }
    )
    fetched_bytes = sum(len(d) for d in RestSource(config).fetch(cursor=None).documents)
    bound = (MAX_QUEUED + 2) * BATCH_BYTES + (8 << 20)
    assert fetched_bytes > 2 * bound  # the whole fetch could not fit under the bound
    with connect(warehouse_url) as wh:
        for expected in (pages * per_page, 0):  # a first sync, then a re-sync
            tracemalloc.start()
            try:
                stats = run_sync(wh, RestSource(config))
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert stats.inserted == expected and stats.rows_fetched == pages * per_page
            assert peak < bound, (
                f"a sync of {fetched_bytes >> 20} MiB of pages peaked at {peak >> 20} MiB"
            )


def test_a_stage_is_reused_empty_by_the_next_sync_of_the_process() -> None:
    """Opening a DuckDB costs more than a small sync's work in it: a closed stage's database
    serves the next one, with nothing of the last sync left in it and its memory limit back."""
    from changewatch.sources.staged import MEMORY_LIMIT, StagedFetch, _bytes

    document = page(1, 3)
    with StreamingNormalizer(source()) as pages:
        pages.add(document, None)
        staged, _ = pages.finish(FetchResult(documents=[document]), synced_at=SYNCED_AT)
        staged.load("stored", staged.arrow("SELECT id FROM fetched"))
        staged.two_streams()
        first = staged.connection
        first.execute("CREATE TEMP TABLE cw_scratch AS SELECT 1 AS a")
    with StagedFetch(source()) as again:
        assert again.connection is first
        names = again.fetch(
            "SELECT table_name FROM duckdb_tables() WHERE NOT internal UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
        )
        assert names == [("fetched",), ("seen",), ("walked",)]
        assert again.fetch("SELECT count(*) FROM walked") == [(0,)]
        limit = again.fetch("SELECT current_setting('memory_limit')")[0][0]
        assert abs(_bytes(MEMORY_LIMIT) - _parse_size(limit)) < 0.05 * _bytes(MEMORY_LIMIT)


def _parse_size(text: str) -> float:
    """DuckDB's shown memory limit (``152.5 MiB``) in bytes."""
    number, unit = text.split()
    return float(number) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
