"""Normalize a fetch while it runs: pages are typed and hashed in batches on a worker thread.

A walk spends its time waiting on the network (and parsing HTTP); normalization spends it in
DuckDB, which releases the GIL. Overlapping the two makes a sync cost about as much as its walk
plus the last batch, instead of the walk plus all of normalization. Each batch is normalized
into the fetch's stage (``sources.staged``) and its pages are let go, and the walk waits
when the worker is ``max_queued`` batches behind: memory follows the batch size, not the fetch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from functools import partial
from types import TracebackType

import duckdb
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.normalize import merge_fields, normalize_into
from changewatch.sources.rejections import Rejection
from changewatch.sources.staged import StagedFetch
from changewatch.sources.values import check_value_sizes, drop_oversized

__all__ = ["BATCH_BYTES", "MAX_QUEUED", "StreamingNormalizer"]

# Large enough that DuckDB's per-batch setup (about 15 ms) is small, small enough that little
# is left to do when the walk ends (about 10,000 GitHub-sized records). Measured on the demo
# API: 4 MiB left 0.11-0.21 s after the walk, 8 MiB 0.21-0.27 s; 1-2 MiB fell behind the walk.
BATCH_BYTES = 4 << 20
# The first batch is smaller: the worker starts while the walk is still young, instead of
# idling through the first 4 MiB (about a tenth of a second of the demo API's pages).
FIRST_BATCH_BYTES = 1 << 20
# Batches handed to the worker and not yet stored before the walk waits for it: enough to
# ride out a slow batch, few enough that the pages held stay a few batches' worth.
MAX_QUEUED = 4

# A batch to normalize: its documents, their records path, the first one's number in the fetch.
_Job = tuple[list[bytes], str | None, int]
_Fields = dict[str, str | None]


class StreamingNormalizer:
    """Takes a fetch's documents as they arrive (``add``) and stages them normalized, in batches.

    Use as a context manager: leaving the block waits for the worker, stops it and drops the
    stage, so a failed fetch leaves no thread or file behind. ``finish`` returns the stage
    (one row per key, as ``normalize_with_fields`` would give) and the payload fields. A
    payload error in a batch is raised by the next ``add`` (ending the walk early: the sync
    fails anyway) or by ``finish``.
    """

    def __init__(
        self,
        config: SourceBase,
        *,
        known_fields: Collection[str] | None = None,
        batch_bytes: int = BATCH_BYTES,
        first_batch_bytes: int = FIRST_BATCH_BYTES,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.config = config
        self.known_fields = list(known_fields) if known_fields is not None else None
        self.batch_bytes = batch_bytes
        self.first_batch_bytes = min(first_batch_bytes, batch_bytes)
        self._submitted = 0  # batches handed to the worker so far
        self.max_queued = max_queued
        self.received = 0
        # Documents held right now (waiting for a batch, or in one not yet stored), and the
        # most ever held: what bounds a sync's memory.
        self.holding = 0
        self.peak_holding = 0
        # The largest document so far: what normalizing (and storing) one value may take.
        self.largest_document = 0
        # Batches the walk normalized itself while the worker was behind (see _submit).
        self.taken_over = 0
        # Records left out (on_bad_record: skip), from the walk and the worker (list.extend
        # holds the GIL: the two never interleave in it).
        self.rejected: list[Rejection] = []
        self._skip = config.on_bad_record == "skip"
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._records_path: str | None = None
        # Batches handed to the worker and not yet collected, oldest first, with what they
        # were given (to take them back unstarted when the walk ends).
        self._queue: deque[tuple[Future[_Fields], _Job]] = deque()
        self._fields: list[_Fields] = []  # of the collected batches, in order
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="normalize")
        self.stage = StagedFetch(config)
        # The worker normalizes on the stage's connection, the calling thread (when the walk
        # is over) on a cursor of it.
        self._duckdb = self.stage.connection

    def __enter__(self) -> StreamingNormalizer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.stage.close()

    def add(self, document: bytes, records_path: str | None) -> None:
        """One document of the fetch, in arrival order (a connector's ``sink``)."""
        # Raises the error of a batch stored so far, in order: no point walking on. (A batch
        # the walk took over can fail before an earlier one; the earlier one's error comes first.)
        self._collect()
        if self._pending and records_path != self._records_path:
            self._submit()  # a batch holds documents of one shape
        # A value over max_value_bytes fails here (or its record is left out), before any
        # memory is spent on it.
        if self._skip:
            document, rejected = drop_oversized(
                document, records_path, self.config, number=self.received + 1
            )
            self.rejected.extend(rejected)
        else:
            check_value_sizes(document, records_path, self.config)
        self._records_path = records_path
        self._pending.append(document)
        self._pending_bytes += len(document)
        self.received += 1
        self.holding += 1
        self.peak_holding = max(self.peak_holding, self.holding)
        self.largest_document = max(self.largest_document, len(document))
        if self._pending_bytes >= (self.batch_bytes if self._submitted else self.first_batch_bytes):
            self._submit()

    def finish(
        self, fetched: FetchResult, *, synced_at: datetime
    ) -> tuple[StagedFetch, dict[str, str | None]]:
        """The stage holding ``fetched`` normalized, and its payload fields.

        A connector that did not hand its documents to ``add`` (one written before sinks
        existed) is normalized here, from ``fetched`` itself.
        """
        if self.received == 0 and fetched.documents:
            for document in fetched.documents:
                self.add(document, fetched.records_path)
        returned = fetched.streamed + len(fetched.documents)
        if self.received != returned:
            # A connector bug: normalizing either count could lose rows or count them twice.
            raise RuntimeError(
                f"source {self.config.name!r}: the connector passed {self.received} documents "
                f"to its sink but returned {returned}"
            )
        # The walk is over. The worker goes on with its queue from the front; this thread
        # takes the last documents, then the batches the worker has not started, from the back:
        # two cores on what is left, with no batch normalized twice. Each batch is stored as
        # soon as it is normalized (rows carry their arrival: the order they are stored in
        # does not matter); errors are raised in document order.
        queued = list(self._queue)
        mine: list[_Fields | Exception] = []
        with self._duckdb.cursor() as cursor:
            last = self._take_pending()
            if last[0]:
                mine.append(self._attempt(last, cursor))
            while queued and queued[-1][0].cancel():
                mine.append(self._attempt(queued.pop()[1], cursor))
        for batch, _ in queued:  # in order: the first bad record is the one reported
            self._fields.append(batch.result())
        self.stage.wait_stored()  # the stored keys, loading beside the walk: the diff needs them
        self._queue.clear()
        for done in reversed(mine):
            if isinstance(done, Exception):
                raise done
            self._fields.append(done)
        self.holding = 0
        # The walk no longer competes for the cores: the rest of the sync may use them all.
        self._duckdb.execute("RESET threads")
        self.stage.keep_newest()
        self.stage.synced_at = synced_at
        return self.stage, merge_fields(self._fields)

    def _collect(self, *, wait: bool = False) -> None:
        """Let go of the batches stored so far (oldest first); with ``wait``, of the oldest."""
        while self._queue and (wait or self._queue[0][0].done()):
            batch, job = self._queue[0]
            if batch.exception() is not None:
                batch.result()  # raises
            self._fields.append(batch.result())
            self._queue.popleft()
            self.holding -= len(job[0])
            wait = False

    def _attempt(self, job: _Job, connection: duckdb.DuckDBPyConnection) -> _Fields | Exception:
        try:
            return self._store_on(*job, connection)
        except Exception as error:  # noqa: BLE001 - raised in order by finish
            return error

    def _submit(self) -> None:
        if not self._pending:
            return
        while len(self._queue) >= self.max_queued:
            # The walk waits for the worker (the pages held stay bounded), but not idly: it
            # normalizes the newest batch the worker has not started, if any, itself.
            self._collect()
            if len(self._queue) >= self.max_queued and not self._take_over_newest():
                self._collect(wait=True)
        job = self._take_pending()
        self._submitted += 1
        # The worker normalizes on the stage's own connection.
        self._queue.append((self._pool.submit(self._store_on, *job, self._duckdb), job))

    def _take_over_newest(self) -> bool:
        """Normalize the newest batch the worker has not started on this thread (a cursor of
        the stage), in its place in the queue; False when the worker has started them all."""
        for place in range(len(self._queue) - 1, -1, -1):
            batch, job = self._queue[place]
            if batch.cancel():
                break
        else:
            return False
        done: Future[_Fields] = Future()
        with self._duckdb.cursor() as cursor:
            result = self._attempt(job, cursor)
        if isinstance(result, Exception):
            done.set_exception(result)  # raised in order, like the worker's
        else:
            done.set_result(result)
        self._queue[place] = (done, job)
        self.taken_over += 1
        return True

    def _take_pending(self) -> _Job:
        """The documents waiting for a batch, their records path and the first one's number."""
        documents, first = self._pending, self.received - len(self._pending)
        self._pending, self._pending_bytes = [], 0
        return documents, self._records_path, first

    def _store_on(
        self,
        documents: list[bytes],
        records_path: str | None,
        first: int,
        connection: duckdb.DuckDBPyConnection,
    ) -> _Fields:
        """Normalize one batch straight into the stage through ``connection``."""
        self.stage.make_room(max(map(len, documents)), connection)
        return normalize_into(
            partial(self.stage.insert, connection=connection),
            documents,
            records_path,
            self.config,
            connection=connection,
            first_document=first,
            known_fields=self.known_fields,
            reject=self.rejected.extend if self._skip else None,
        )
