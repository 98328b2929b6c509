"""The sync sensor's decisions: which sources to probe now, and which to sync given the probes.

Pure (no Dagster, no I/O): the cursor, probe results and the clock in; syncs to request and the
next cursor out. The sensor (pipeline/triggers/sync_sensors.py) sends the probes between the two
steps.

A source is synced when its probe says it changed (or it was never probed), when its probe
failed (at its interval slot, as without probes), or when ``probe.reconcile`` has passed since
its last requested sync. A source without a probe (``probe: false``, a REST source with a
parent listing) syncs at every interval slot, as before. Run keys come from the data:
``<source>:probe:<before>><after>`` (body hashes) for a change, ``<source>:reconcile:<slot>``,
and ``<source>:<slot>`` at the interval; Dagster drops a key that already ran, so a repeated
tick or a restart never doubles a sync.

A source with ``min_interval``/``max_interval`` is probed when its adaptive envelope says
(pipeline/polling/adaptive_envelope.py) instead of at slots: a change tightens it, quiet probes
widen it, a failed probe backs off (never sooner than a ``Retry-After``) and requests a sync with
key ``<source>:retry:<due>`` unless the server rate-limited the probe (a sync would be too).

Stop conditions: a source past its ``stop.until``, or with ``stop.max_failures`` failed probes
in a row, is paused (``Decision.pauses``, which the sensor keeps in the Dagster instance); a
paused source is neither probed nor synced, and one resumed (its pause gone) starts afresh.

The cursor is JSON: ``{"v": 1, "s": {<source>: {"p": probe state, "t": slot last probed,
"r": epoch of the last requested sync, "i": slot of the last interval sync, "e": envelope
[interval, next due, quiet, failures, reason], "f": failed probes in a row (without an
envelope), "z": 1 while paused}}}``; hashes and validators only, never bodies (some 60 bytes a
source without validators, 60 more with an envelope).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from changewatch.pipeline.polling.adaptive_envelope import (
    Bounds,
    Observation,
    PollState,
    first_state,
    observe,
)
from changewatch.pipeline.polling.poll_slots import due_slot, jitter_offset
from changewatch.sources.base import SourceBase
from changewatch.sources.probe import ProbeResult, has_probe

__all__ = [
    "CURSOR_VERSION",
    "Decision",
    "Schedule",
    "SyncRequest",
    "decide",
    "due_probes",
    "load_cursor",
    "probe_states",
]

CURSOR_VERSION = 1


@dataclass(frozen=True)
class SyncRequest:
    """One sync to request: its source, run key and why (``probe``, ``reconcile``,
    ``interval``)."""

    source: str
    run_key: str
    reason: str


@dataclass(frozen=True)
class Schedule:
    """Where a source's polling stands after a tick: when it is next due (None while paused),
    its interval, why, failed probes in a row, and whether it is paused."""

    next_due: float | None
    interval: float
    reason: str
    failures: int = 0
    paused: bool = False


@dataclass(frozen=True)
class Decision:
    """What one tick requests, the cursor to keep, each failed probe's error, each source's
    schedule, the pauses decided now (source -> reason) and the sources found resumed."""

    requests: list[SyncRequest]
    cursor: str
    errors: dict[str, str]
    schedules: dict[str, Schedule] = field(default_factory=dict)
    pauses: dict[str, str] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)


def load_cursor(cursor: str | None) -> dict[str, dict[str, Any]]:
    """Per source state from a cursor; an empty, unreadable or older cursor starts afresh
    (every source is then probed as new, which means one sync each: safe, never a miss).

    >>> load_cursor(None), load_cursor("not json"), load_cursor('{"v": 1, "s": {"a": {"r": 5}}}')
    ({}, {}, {'a': {'r': 5}})
    """
    if not cursor:
        return {}
    try:
        data = json.loads(cursor)
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
        return {}
    sources = data.get("s")
    return sources if isinstance(sources, dict) else {}


def probe_states(cursor: str | None) -> dict[str, Any]:
    """Each source's probe state kept in ``cursor`` (by name), for the next probes."""
    return {name: entry["p"] for name, entry in load_cursor(cursor).items() if "p" in entry}


def probed(source: SourceBase) -> bool:
    """Whether the sensor probes ``source`` (else it syncs at every interval slot)."""
    return source.probe.enabled and has_probe(source)


def _slot(source: SourceBase, now: float) -> int:
    return due_slot(now, source.interval, jitter_offset(source.name, source.jitter))


def _bounds(source: SourceBase) -> Bounds | None:
    """The source's envelope, or None when it is probed at fixed slots."""
    if source.min_interval is None or source.max_interval is None:
        return None
    return Bounds(source.min_interval, source.max_interval, source.interval)


def _past_until(source: SourceBase, now: float) -> bool:
    deadline = source.stop.deadline()
    return deadline is not None and now >= deadline


def due_probes(
    sources: Sequence[SourceBase],
    cursor: str | None,
    now: float,
    paused: Collection[str] = (),
) -> list[SourceBase]:
    """The probed sources due now: their envelope's due time came, or (without one) their
    interval slot began since their last probe. Paused sources and those past their
    ``stop.until`` are never due; one just resumed is due at once."""
    state = load_cursor(cursor)
    due = []
    for source in sources:
        entry = state.get(source.name, {})
        if not probed(source) or source.name in paused or _past_until(source, now):
            continue
        if entry.get("z"):
            due.append(source)
        elif _bounds(source) is not None:
            if "e" not in entry or now >= entry["e"][1]:
                due.append(source)
        elif entry.get("t") != _slot(source, now):
            due.append(source)
    return due


def _hash(state: Any) -> str:
    """A short, stable name of a probe state, for run keys.

    >>> _hash({}) == _hash({}), len(_hash({"": {"h": "ab"}}))
    (True, 12)
    """
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def decide(
    sources: Sequence[SourceBase],
    cursor: str | None,
    results: Mapping[str, ProbeResult],
    now: float,
    paused: Mapping[str, str] | None = None,
) -> Decision:
    """The syncs to request at ``now`` given this tick's probe ``results`` (by source name;
    sources not probed this tick have none), and the next cursor. ``paused``: the sources
    paused now (name -> reason), as the Dagster instance keeps them."""
    before = load_cursor(cursor)
    paused = paused or {}
    decision = Decision(requests=[], cursor="", errors={})
    after: dict[str, dict[str, Any]] = {}
    for source in sources:
        name = source.name
        entry = dict(before.get(name) or {})
        after[name] = entry
        if name in paused:
            entry["z"] = 1
            decision.schedules[name] = _paused(source, entry, paused[name])
            continue
        if entry.pop("z", None):
            decision.resumed.append(name)  # its pause is gone: start afresh
            entry.pop("e", None)
            entry.pop("f", None)
        if _past_until(source, now):
            when = datetime.fromtimestamp(source.stop.deadline() or 0, UTC).isoformat()
            _pause(decision, entry, source, f"stop.until {when} has passed")
            continue
        result = results.get(name)
        if result is not None and (result.error is not None or result.changed is None):
            decision.errors[name] = result.error or "no probe"
        if _bounds(source) is not None:
            request = _enveloped(source, entry, result, now)
        else:
            request = _slotted(source, entry, result, now)
        limit, failures = source.stop.max_failures, _failures(entry)
        if limit is not None and failures >= limit and name in decision.errors:
            why = f"{failures} failed probes in a row (stop.max_failures: {limit})"
            _pause(decision, entry, source, f"{why}; the last: {decision.errors[name]}")
            continue
        if request is not None:
            entry["r"] = math.floor(now)
            decision.requests.append(request)
        decision.schedules[name] = _schedule(source, entry, now)
    text = json.dumps({"v": CURSOR_VERSION, "s": after}, sort_keys=True, separators=(",", ":"))
    return replace(decision, cursor=text)


def _pause(decision: Decision, entry: dict[str, Any], source: SourceBase, reason: str) -> None:
    entry["z"] = 1
    decision.pauses[source.name] = reason
    decision.schedules[source.name] = _paused(source, entry, reason)


def _failures(entry: Mapping[str, Any]) -> int:
    """Failed probes in a row, as the envelope or (without one) the cursor counts them."""
    state = _unpack(entry.get("e"))
    return state.failures if state is not None else entry.get("f", 0)


def _paused(source: SourceBase, entry: Mapping[str, Any], reason: str) -> Schedule:
    state = _unpack(entry.get("e"))
    interval = state.interval if state is not None else source.interval
    return Schedule(None, interval, reason, _failures(entry), paused=True)


def _slotted(
    source: SourceBase, entry: dict[str, Any], result: ProbeResult | None, now: float
) -> SyncRequest | None:
    """Today's rules: a probe per interval slot, a sync on a change, at the slot when the
    probe failed or there is none, and by ``probe.reconcile``."""
    name = source.name
    slot = _slot(source, now)
    request: SyncRequest | None = None
    if not probed(source):
        entry.pop("p", None)
        request = SyncRequest(name, f"{name}:{slot}", "interval")
    elif result is not None:
        entry["t"] = slot
        if result.error is not None or result.changed is None:
            entry["f"] = entry.get("f", 0) + 1
            request = SyncRequest(name, f"{name}:{slot}", "interval")
        else:
            entry.pop("f", None)
            old = _hash(entry["p"]) if "p" in entry else "none"
            entry["p"] = result.state
            if result.changed:
                request = SyncRequest(name, f"{name}:probe:{old}>{_hash(result.state)}", "probe")
    if request is None and probed(source):
        request = _reconcile(source, entry, now)
    if request is not None and request.reason == "interval":
        # An interval key stays the same all slot long: requested once per slot.
        request = None if entry.get("i") == slot else request
        entry["i"] = slot
    return request


def _enveloped(
    source: SourceBase, entry: dict[str, Any], result: ProbeResult | None, now: float
) -> SyncRequest | None:
    """The envelope's rules: the probe's observation sets the next due time; a sync on a
    change, after a failed probe that was not rate limited, and by ``probe.reconcile``."""
    bounds = _bounds(source)
    assert bounds is not None
    name = source.name
    state = _unpack(entry.get("e")) or first_state(bounds, now)
    request: SyncRequest | None = None
    if result is not None and (result.error is not None or result.changed is None):
        if result.retry_after is None:  # a rate-limited sync would only be deferred
            request = SyncRequest(name, f"{name}:retry:{math.floor(state.next_due)}", "interval")
        seen = Observation("failed", retry_after=result.retry_after, error=result.error)
        state = observe(state, seen, now, bounds)
    elif result is not None:
        old = _hash(entry["p"]) if "p" in entry else "none"
        entry["p"] = result.state
        state = observe(
            state, Observation("changed" if result.changed else "unchanged"), now, bounds
        )
        if result.changed:
            request = SyncRequest(name, f"{name}:probe:{old}>{_hash(result.state)}", "probe")
    entry["e"] = _pack(state)
    if request is None and state.failures == 0:  # not while backing off
        request = _reconcile(source, entry, now)
    return request


def _pack(state: PollState) -> list[Any]:
    return [
        round(state.interval, 3),
        round(state.next_due, 3),
        state.quiet,
        state.failures,
        state.reason,
    ]


def _unpack(packed: Any) -> PollState | None:
    """The envelope state kept in the cursor, or None (never kept, or unreadable)."""
    try:
        interval, next_due, quiet, failures, reason = packed
        return PollState(float(interval), float(next_due), int(quiet), int(failures), str(reason))
    except (TypeError, ValueError):
        return None


def _schedule(source: SourceBase, entry: Mapping[str, Any], now: float) -> Schedule:
    """The source's schedule as the cursor now holds it."""
    state = _unpack(entry.get("e"))
    if state is not None:
        return Schedule(state.next_due, state.interval, state.reason, state.failures)
    offset = jitter_offset(source.name, source.jitter)
    next_slot = (_slot(source, now) + 1) * source.interval + offset
    failures = entry.get("f", 0)
    why = f"probe failed {failures} in a row" if failures else "fixed interval"
    return Schedule(next_slot, source.interval, why, failures)


def _reconcile(source: SourceBase, entry: Mapping[str, Any], now: float) -> SyncRequest | None:
    """A sync when ``probe.reconcile`` has passed since the last one requested (never before
    the source's first probe, which requests one anyway)."""
    last = entry.get("r")
    every = source.probe.reconcile
    if last is None or now - last < every:
        return None
    slot = math.floor((now - jitter_offset(source.name, source.jitter)) / every)
    return SyncRequest(source.name, f"{source.name}:reconcile:{slot}", "reconcile")
