"""Normalize a fetch while it runs: pages are typed and hashed in batches on a worker thread.

A walk spends its time waiting on the network (and parsing HTTP); normalization spends it in
DuckDB, which releases the GIL. Overlapping the two makes a sync cost about as much as its walk
plus the last batch, instead of the walk plus all of normalization.
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from types import TracebackType

import duckdb
import polars as pl
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.normalize import (
    Batch,
    finish_batches,
    normalize_batch,
    normalize_with_fields,
)

__all__ = ["BATCH_BYTES", "StreamingNormalizer"]

# Large enough that DuckDB's per-batch setup (about 15 ms) is small, small enough that little
# is left to do when the walk ends (about 10,000 GitHub-sized records). Measured on the demo
# API: 4 MiB left 0.11-0.21 s after the walk, 8 MiB 0.21-0.27 s; 1-2 MiB fell behind the walk.
BATCH_BYTES = 4 << 20

# A batch to normalize: its documents, their records path, the first one's number in the fetch.
_Job = tuple[list[bytes], str | None, int]


class StreamingNormalizer:
    """Takes a fetch's documents as they arrive (``add``) and normalizes them in batches.

    Use as a context manager: leaving the block waits for the worker and stops it, so a failed
    fetch leaves no thread behind. ``finish`` returns what ``normalize_with_fields`` would
    return for the whole fetch. A payload error in a batch is raised by the next ``add``
    (ending the walk early: the sync fails anyway) or by ``finish``.
    """

    def __init__(
        self,
        config: SourceBase,
        *,
        known_fields: Collection[str] | None = None,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        self.config = config
        self.known_fields = list(known_fields) if known_fields is not None else None
        self.batch_bytes = batch_bytes
        self.received = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._records_path: str | None = None
        # Each batch handed to the worker, with what it was given (to take it back, unstarted).
        self._batches: list[tuple[Future[Batch], _Job]] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="normalize")
        # One single-threaded in-memory DuckDB for every batch; the worker uses this
        # connection, the calling thread (when the walk is over) a cursor of it.
        self._duckdb = duckdb.connect(config={"threads": 1})

    def __enter__(self) -> StreamingNormalizer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._duckdb.close()

    def add(self, document: bytes, records_path: str | None) -> None:
        """One document of the fetch, in arrival order (a connector's ``sink``)."""
        for batch, _ in self._batches:
            if batch.done() and batch.exception() is not None:
                batch.result()  # raises: no point walking on
        if self._pending and records_path != self._records_path:
            self._submit()  # a batch holds documents of one shape
        self._records_path = records_path
        self._pending.append(document)
        self._pending_bytes += len(document)
        self.received += 1
        if self._pending_bytes >= self.batch_bytes:
            self._submit()

    def finish(
        self, fetched: FetchResult, *, synced_at: datetime
    ) -> tuple[pl.DataFrame, dict[str, str | None]]:
        """The normalized frame and payload fields of ``fetched``, whose documents were added.

        A connector that did not hand its documents to ``add`` (one written before sinks
        existed) is normalized here in one pass, from ``fetched`` itself.
        """
        if self.received == 0 and fetched.documents:
            return normalize_with_fields(
                fetched, self.config, synced_at=synced_at, known_fields=self.known_fields
            )
        if self.received != len(fetched.documents):
            # A connector bug: normalizing either list could lose rows or count them twice.
            raise RuntimeError(
                f"source {self.config.name!r}: the connector passed {self.received} documents "
                f"to its sink but returned {len(fetched.documents)}"
            )
        # The walk is over. The worker goes on with its queue from the front; this thread
        # takes the last documents, then the batches the worker has not started, from the back:
        # two cores on what is left, with no batch normalized twice.
        jobs = [job for _, job in self._batches]
        mine: dict[int, Batch | Exception] = {}
        with self._duckdb.cursor() as cursor:
            last = self._take_pending()
            if last[0]:
                jobs.append(last)
                mine[len(jobs) - 1] = self._attempt(last, cursor)
            for index in reversed(range(len(self._batches))):
                if not self._batches[index][0].cancel():
                    break  # running or done: so is every batch before it
                mine[index] = self._attempt(jobs[index], cursor)
        batches = []
        for index in range(len(jobs)):  # in order: the first bad record is the one reported
            done = mine[index] if index in mine else self._batches[index][0].result()
            if isinstance(done, Exception):
                raise done
            batches.append(done)
        return finish_batches(batches, self.config, synced_at=synced_at)

    def _attempt(self, job: _Job, connection: duckdb.DuckDBPyConnection) -> Batch | Exception:
        try:
            return self._normalize(*job, connection)
        except Exception as error:  # noqa: BLE001 - raised in order by finish
            return error

    def _submit(self) -> None:
        if self._pending:
            job = self._take_pending()
            self._batches.append((self._pool.submit(self._normalize, *job, self._duckdb), job))

    def _take_pending(self) -> _Job:
        """The documents waiting for a batch, their records path and the first one's number."""
        documents, first = self._pending, self.received - len(self._pending)
        self._pending, self._pending_bytes = [], 0
        return documents, self._records_path, first

    def _normalize(
        self,
        documents: list[bytes],
        records_path: str | None,
        first: int,
        connection: duckdb.DuckDBPyConnection,
    ) -> Batch:
        return normalize_batch(
            documents,
            records_path,
            self.config,
            first_document=first,
            known_fields=self.known_fields,
            connection=connection,
        )
