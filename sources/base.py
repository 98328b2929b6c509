"""What every connector shares: the source settings model and the fetch contract."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Protocol

import orjson
from changewatch.sources.limits import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_RESPONSE_TIMEOUT,
    DEFAULT_SYNC_TIMEOUT,
    ByteSize,
)
from changewatch.sources.polling import SourceStop, envelope_problem
from changewatch.sources.webhook import WebhookSettings
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

ColumnType = Literal[
    "text", "bigint", "integer", "double", "boolean", "timestamp", "json", "text[]", "bigint[]"
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"5m"``, ``"1.5h"``.

    >>> parse_duration("5m"), parse_duration(30), parse_duration("250ms")
    (300.0, 30.0, 0.25)
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '5m'")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (use e.g. 30, '90s', '5m', '2h', '1d')")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _identifier(value: str) -> str:
    if not IDENTIFIER.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use lowercase letters, digits and '_' (max 63)"
        )
    return value


Identifier = Annotated[str, BeforeValidator(_identifier)]

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _env_name(value: str) -> str:
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        raise ValueError(
            f"{value!r} is not an environment variable name (use e.g. GITHUB_TOKEN): "
            "put the variable's name here, never the secret itself"
        )
    return value


# The name of an environment variable holding a secret: config never holds secrets.
EnvVarName = Annotated[str, BeforeValidator(_env_name)]


class ColumnSpec(BaseModel):
    """One typed column of a source's table, read from a path in each record.

    The path is dotted (``assignee.login``); ``[]`` maps over a list (``labels[].name``).
    Without a path the column is read from the record's field of the same name.
    """

    model_config = ConfigDict(extra="forbid")

    type: ColumnType = Field(default="text", description="The column's type in the warehouse.")
    path: str | None = Field(
        default=None,
        description=(
            "Dotted path of the value in each record (`assignee.login`, `labels[].name`); default:"
            " the field of the column's name."
        ),
    )


def _column_shorthand(value: Any) -> Any:
    # `title: text` is shorthand for `title: {type: text}`.
    return {"type": value} if isinstance(value, str) else value


class StormGuard(BaseModel):
    """Holds a sync's changes from evaluation when it changes too much of a source at once.

    A sync that inserts, updates or deletes more than ``max_share`` of the rows the source had
    (and at least ``min_rows`` rows) is more likely an API format change or a broken
    normalization than real news; its changes wait for ``changewatch release``.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="Whether a sync that changes too much is held from evaluation."
    )
    max_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="The share of the source's rows a sync may change before its changes are held.",
    )
    min_rows: int = Field(
        default=100,
        ge=1,
        description="Fewest changed rows that count as a storm, whatever the share.",
    )


class ProbeSettings(BaseModel):
    """The cheap change probe the sync sensor sends at each interval (see sources/probe.py).

    A probe is one conditional GET of the first page (a request per repository on GitHub);
    only a change starts a sync run. ``reconcile`` starts one anyway when that long has passed
    since the last sync requested, so nothing depends on a probe being right. ``timeout``
    bounds each probe request (and never exceeds the source's ``response_timeout``).
    ``probe: false`` syncs at every interval without probing, as before.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description=(
            "Send a cheap change probe at each interval and sync only on a change (`probe: false`:"
            " sync every interval)."
        ),
    )
    reconcile: Duration = Field(
        default=3600.0,
        gt=0,
        description="Sync anyway once this long has passed since the last sync requested.",
    )
    timeout: Duration = Field(
        default=10.0,
        gt=0,
        description="Bound of each probe request (never above the source's `response_timeout`).",
    )


def _probe_shorthand(value: Any) -> Any:
    # `probe: false` is shorthand for `probe: {enabled: false}`.
    return {"enabled": value} if isinstance(value, bool) else value


@dataclass(frozen=True)
class TargetScope:
    """One target of a fleet source (``sources/fleet.py``).

    A target's sync keeps its own cursor, validators and run records under its own name
    (``<fleet>[<target>]``), takes its fleet's lock and payload fields (they describe the one
    table the targets share), and compares, counts and deletes only the rows whose
    ``column`` holds ``value``.
    """

    fleet: str
    column: str
    value: str


class SourceBase(BaseModel):
    """Settings every source declares, whatever its type."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Identifier = Field(
        description="The source's name (lowercase letters, digits, `_`), unique in the file."
    )
    type: str = Field(description="The connector: `rest`, `github` or `feed`.")
    table: Identifier = Field(
        description="The warehouse table the source syncs into, unique in the file."
    )
    primary_key: list[Identifier] = Field(
        min_length=1, description="The column(s) that identify a record; one name or a list."
    )
    updated_at: Identifier | None = Field(
        default=None, description="A timestamp column: the cursor of incremental syncs."
    )
    columns: dict[Identifier, Annotated[ColumnSpec, BeforeValidator(_column_shorthand)]] = Field(
        description="The table's typed columns: `name: type` or `name: {type, path}`."
    )
    # snapshot: every sync lists everything, so a missing key is a delete.
    # incremental: every sync asks only for what changed since the stored cursor.
    sync: Literal["snapshot", "incremental"] = Field(
        default="snapshot",
        description=(
            "`snapshot`: every sync lists everything (a missing key is a delete); `incremental`: "
            "only what changed since the cursor."
        ),
    )
    interval: Duration = Field(
        default=900.0, description="How often the source is probed (or synced, without probes)."
    )
    # The adaptive envelope (sources/polling.py): with both set, the sensor probes between
    # these as changes come and go, starting at `interval`; without, at every interval.
    min_interval: Duration | None = Field(
        default=None, description="Lower bound of the adaptive envelope (set with `max_interval`)."
    )
    max_interval: Duration | None = Field(
        default=None, description="Upper bound of the adaptive envelope (set with `min_interval`)."
    )
    jitter: Duration = Field(
        default=0.0,
        description=(
            "Up to this much, stable per source, added to each interval so sources spread out."
        ),
    )
    cron: str | None = Field(
        default=None, description="A cron schedule to sync on instead of the interval."
    )
    timezone: str = Field(default="UTC", description="The time zone of `cron`.")
    description: str | None = Field(
        default=None, description="What the source is, for people (shown in the Dagster UI)."
    )
    # silent: the first sync records the baseline without handing its changes to watches,
    # so turning on a watch does not notify about every object that already exists.
    baseline: Literal["silent", "evaluate"] = Field(
        default="silent",
        description=(
            "`silent`: the first sync records a baseline no watch is told about; `evaluate`: "
            "watches see it."
        ),
    )
    storm: StormGuard = Field(
        default_factory=StormGuard,
        description="Holds a sync's changes when it changes too much of the source at once.",
    )
    # When a payload field appears that was not there before (schema drift): evolve adds it
    # as a column of the table, discard keeps it in the raw payload only, freeze fails the
    # sync until the config says what to do. Either way a drift event is recorded, and the
    # content hash (declared columns only) does not change.
    schema_mode: Literal["evolve", "discard", "freeze"] = Field(
        default="evolve",
        alias="schema",
        description=(
            "A payload field that was not there before: `evolve` adds a column, `discard` keeps it"
            " in the raw payload, `freeze` fails the sync."
        ),
    )
    # A cron for a reconciliation sweep: a full walk that turns vanished objects into deletes
    # (for incremental sources, whose `since` walks cannot see deletions).
    reconcile: str | None = Field(
        default=None,
        description=(
            "A cron for a full sweep that turns vanished objects into deletes (for incremental "
            "sources)."
        ),
    )
    # Between syncs, a cheap request says whether anything changed (ProbeSettings).
    probe: Annotated[ProbeSettings, BeforeValidator(_probe_shorthand)] = Field(
        default_factory=ProbeSettings,
        description="The cheap change probe sent between syncs (`false`: none).",
    )
    # When polling stops until `changewatch resume` (sources/polling.py).
    stop: SourceStop = Field(
        default_factory=SourceStop, description="When polling pauses until `changewatch resume`."
    )
    # Where the provider sends change events (sources/webhook.py); polling then only reconciles.
    webhook: WebhookSettings | None = Field(
        default=None,
        description="Where the provider POSTs change events; polling then only reconciles.",
    )
    # Bounds of what one sync accepts from the API (see sources/limits.py): decoded bytes of
    # one response, seconds one response may take to arrive whole, seconds the whole walk may
    # take. Passing one fails the sync, naming the source, the request and the setting.
    max_response_bytes: ByteSize = Field(
        default=DEFAULT_MAX_RESPONSE_BYTES,
        ge=1,
        description="Largest response (counted decoded) one request may return.",
    )
    response_timeout: Duration = Field(
        default=DEFAULT_RESPONSE_TIMEOUT,
        gt=0,
        description="Longest one response may take, from the request to its last byte.",
    )
    sync_timeout: Duration = Field(
        default=DEFAULT_SYNC_TIMEOUT,
        gt=0,
        description="Longest the whole walk of a sync may take (pages, retries, rate-limit waits).",
    )
    # The largest value (a string's UTF-8 bytes, anything else as JSON text) a record may
    # carry. Normalizing a document takes DuckDB 19 (text) to 35 (a json column) times its size
    # in memory, so a sync refuses one value past this, naming source, record and field,
    # instead of running out. 32 MiB: what a sync stores within about 0.75 GiB of RSS on both
    # backends (bench/bench_big_values.py); 64 MiB of json needed over 2 GB.
    max_value_bytes: ByteSize = Field(
        default=32 << 20,
        ge=1,
        description=(
            "Largest single value a record may carry (a string's UTF-8 bytes, else its JSON)."
        ),
    )
    on_bad_record: Literal["fail", "skip"] = Field(
        default="fail",
        description=(
            "What a sync does with a record it cannot store (a value over max_value_bytes, a "
            "value that does not fit its declared type, no primary key). fail: the sync fails "
            "with one line naming the source and the record, and stores nothing. skip: the "
            "sync stores the other records, writes the rejected one's key, field and reason "
            "to table rejected_records (the no_rejected_records check warns), infers no "
            "deletes, and keeps its cursor and HTTP validators so the record comes again on "
            "the next sync; once it is stored, its rejected row is gone."
        ),
    )
    # A redirect into a loopback, link-local or private network is refused unless base_url is
    # in that kind of network itself (a cloud's metadata service is one redirect away from
    # any API); true follows it anyway, for an API that hands off to an internal host.
    allow_private_redirects: bool = Field(
        default=False,
        description=(
            "Follow a redirect into a loopback, link-local or private network even when "
            "base_url is not in one."
        ),
    )

    # Whether a walk without cursor returns the complete listing (so a reconciliation sweep
    # can turn absent keys into deletes). Feeds, which show only their latest entries, can't.
    lists_everything: ClassVar[bool] = True
    # Set on the config of one target of a fleet (sources/fleet.py), never from the file.
    _target: TargetScope | None = PrivateAttr(default=None)

    @property
    def target_scope(self) -> TargetScope | None:
        """The fleet target this config syncs, or None for a whole source."""
        return self._target

    @property
    def owner(self) -> str:
        """The source that owns the table: its fleet's name for a target, else its own."""
        return self._target.fleet if self._target is not None else self.name

    @model_validator(mode="before")
    @classmethod
    def _primary_key_as_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("primary_key"), str):
            data = {**data, "primary_key": [data["primary_key"]]}
        return data

    @model_validator(mode="after")
    def _check_columns(self) -> SourceBase:
        for key in self.primary_key:
            if key not in self.columns:
                raise ValueError(f"primary_key column {key!r} is not declared in columns")
        if self.updated_at is not None:
            if self.updated_at not in self.columns:
                raise ValueError(
                    f"updated_at column {self.updated_at!r} is not declared in columns"
                )
            if self.columns[self.updated_at].type != "timestamp":
                raise ValueError(f"updated_at column {self.updated_at!r} must have type timestamp")
        if self.sync == "incremental" and self.updated_at is None:
            raise ValueError("an incremental source needs updated_at (the cursor column)")
        # Postgres cuts identifiers at 63 bytes: old_/new_ prefixes and the _changes_seq
        # suffix must still fit.
        long_columns = [c for c in self.columns if len(c) > 59]
        if long_columns:
            raise ValueError(f"column names longer than 59 characters: {long_columns}")
        if len(self.table) > 51:
            raise ValueError(f"table name {self.table!r} is longer than 51 characters")
        reserved = [c for c in self.columns if c.startswith("_")]
        if reserved:
            raise ValueError(f"column names starting with '_' are reserved: {reserved}")
        if self.interval <= 0:
            raise ValueError("interval must be positive")
        if self.reconcile is not None and not self.lists_everything:
            raise ValueError(
                "reconcile: this source cannot list everything, so a sweep could not tell a "
                "vanished object from one outside its window"
            )
        if self.jitter < 0 or self.jitter >= self.interval:
            raise ValueError("jitter must be at least 0 and less than interval")
        if (problem := envelope_problem(self)) is not None:
            raise ValueError(problem)
        return self

    def env_vars(self) -> list[str]:
        """Names of the environment variables this source reads (secrets, never their values)."""
        return []


@dataclass(frozen=True)
class Validator:
    """What a server gave to identify a response, sent back on the next request as
    ``If-None-Match`` / ``If-Modified-Since`` so an unchanged resource costs a 304."""

    etag: str | None = None
    last_modified: str | None = None
    # The walk the request belonged to (its first request's key), for connectors that compare
    # a walk's shape with the stored one: a page that vanished is news even when every page
    # left answers 304. A validator with neither etag nor last_modified records only that.
    walk: str | None = None

    @property
    def sendable(self) -> bool:
        """Whether there is anything to send back (not just a record of the request)."""
        return bool(self.etag or self.last_modified)


@dataclass
class FetchResult:
    """What one sync fetched: the JSON documents as received, and how it went.

    Records stay inside their documents (one per page) until normalization splits and types
    them in one columnar pass; no per-record Python objects are kept while a walk goes on.
    A fetch with a sink hands each document to it and keeps none (``streamed`` counts them),
    so a walk holds no more pages than the sink does.
    """

    documents: list[bytes]
    # Where the list of records sits inside each document (dotted); None: the document is it.
    records_path: str | None = None
    # Records in all documents, when the walk counted them (None: only normalization will).
    record_count: int | None = None
    pages: int = 0
    requests: int = 0
    # True when the documents hold the complete upstream listing, so absent keys are deletes.
    complete: bool = False
    # Validators to remember for the next sync, keyed by request (URL without credentials).
    # Stored in the same transaction as the rows they describe, never ahead of them.
    validators: dict[str, Validator] = field(default_factory=dict)
    # Every request was answered 304 Not Modified: nothing changed, nothing to parse.
    not_modified: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    # Documents handed to the fetch's sink instead of being kept in ``documents``.
    streamed: int = 0

    @classmethod
    def from_records(cls, records: list[dict[str, Any]], **details: Any) -> FetchResult:
        """A result from records a connector built itself (feeds, computed listings)."""
        return cls(documents=[orjson.dumps(records)], record_count=len(records), **details)

    def records(self) -> list[dict[str, Any]]:
        """Every record, decoded (for tests and debugging; syncs never need this)."""
        found: list[dict[str, Any]] = []
        for document in self.documents:
            value: Any = orjson.loads(document)
            for step in self.records_path.split(".") if self.records_path else ():
                value = value[step]
            found.extend(value)
        return found


# Called with each document of a fetch as soon as it is final, and its records path.
DocumentSink = Callable[[bytes, str | None], None]


class Source(Protocol):
    """A connector: turns its settings and the stored cursor into raw records."""

    config: SourceBase

    def fetch(
        self,
        *,
        cursor: str | None,
        validators: Mapping[str, Validator] | None = None,
        sink: DocumentSink | None = None,
    ) -> FetchResult:
        """Fetch records changed since ``cursor`` (an ISO-8601 timestamp), or all when None.

        ``validators`` are the ones the last successful sync stored (see ``FetchResult``);
        a connector that supports conditional requests sends them back. ``sink`` receives
        every document of the result once, in arrival order, while the fetch goes on (so
        normalization can overlap the walk); the result then keeps none of them and counts
        them in ``streamed`` (a sync of any size holds only the pages its sink holds).

        Raises ``changewatch.sources.errors.SourceError`` (or a subclass) on failure; never
        returns partial results for a failed walk, so a failed sync leaves the stored cursor
        where it was.
        """
        ...
