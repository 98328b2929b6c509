"""The sync sensor's decisions: which sources to probe now, and which to sync given the probes.

Pure (no Dagster, no I/O): the cursor, probe results and the clock in; syncs to request and the
next cursor out. The sensor (pipeline/sensors.py) sends the probes between the two steps.

A source is synced when its probe says it changed (or it was never probed), when its probe
failed (at its interval slot, as without probes), or when ``probe.reconcile`` has passed since
its last requested sync. A source without a probe (``probe: false``, a REST source with a
parent listing) syncs at every interval slot, as before. Run keys come from the data:
``<source>:probe:<before>><after>`` (body hashes) for a change, ``<source>:reconcile:<slot>``,
and ``<source>:<slot>`` at the interval; Dagster drops a key that already ran, so a repeated
tick or a restart never doubles a sync.

The cursor is JSON: ``{"v": 1, "s": {<source>: {"p": probe state, "t": slot last probed,
"r": epoch of the last requested sync, "i": slot of the last interval sync}}}``; hashes and
validators only, never bodies (some 60 bytes a source without validators).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from changewatch.pipeline.timing import due_slot, jitter_offset
from changewatch.sources.base import SourceBase
from changewatch.sources.probe import ProbeResult, has_probe

__all__ = [
    "CURSOR_VERSION",
    "Decision",
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
class Decision:
    """What one tick requests, the cursor to keep, and each failed probe's error."""

    requests: list[SyncRequest]
    cursor: str
    errors: dict[str, str]


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


def due_probes(sources: Sequence[SourceBase], cursor: str | None, now: float) -> list[SourceBase]:
    """The probed sources whose interval slot began since their last probe."""
    state = load_cursor(cursor)
    return [s for s in sources if probed(s) and state.get(s.name, {}).get("t") != _slot(s, now)]


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
) -> Decision:
    """The syncs to request at ``now`` given this tick's probe ``results`` (by source name;
    sources not probed this tick have none), and the next cursor."""
    before = load_cursor(cursor)
    after: dict[str, dict[str, Any]] = {}
    requests: list[SyncRequest] = []
    errors: dict[str, str] = {}
    for source in sources:
        name = source.name
        entry = dict(before.get(name) or {})
        slot = _slot(source, now)
        request: SyncRequest | None = None
        if not probed(source):
            entry.pop("p", None)
            request = SyncRequest(name, f"{name}:{slot}", "interval")
        elif (result := results.get(name)) is not None:
            entry["t"] = slot
            if result.error is not None or result.changed is None:
                errors[name] = result.error or "no probe"
                request = SyncRequest(name, f"{name}:{slot}", "interval")
            else:
                old = _hash(entry["p"]) if "p" in entry else "none"
                entry["p"] = result.state
                if result.changed:
                    key = f"{name}:probe:{old}>{_hash(result.state)}"
                    request = SyncRequest(name, key, "probe")
        if request is None and probed(source):
            request = _reconcile(source, entry, now)
        if request is not None and request.reason == "interval":
            # An interval key stays the same all slot long: requested once per slot.
            request = None if entry.get("i") == slot else request
            entry["i"] = slot
        if request is not None:
            entry["r"] = math.floor(now)
            requests.append(request)
        after[name] = entry
    text = json.dumps({"v": CURSOR_VERSION, "s": after}, sort_keys=True, separators=(",", ":"))
    return Decision(requests=requests, cursor=text, errors=errors)


def _reconcile(source: SourceBase, entry: Mapping[str, Any], now: float) -> SyncRequest | None:
    """A sync when ``probe.reconcile`` has passed since the last one requested (never before
    the source's first probe, which requests one anyway)."""
    last = entry.get("r")
    every = source.probe.reconcile
    if last is None or now - last < every:
        return None
    slot = math.floor((now - jitter_offset(source.name, source.jitter)) / every)
    return SyncRequest(source.name, f"{source.name}:reconcile:{slot}", "reconcile")
