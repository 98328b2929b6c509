"""Paused sources and watches, kept in the Dagster instance's key-value store.

Why there, not in the warehouse: the sync sensor must know a pause at every tick without
opening the warehouse (a DuckDB file a run holds cannot be opened by another process), and a
pause must outlive every process. Who writes: the sensor (``stop.until``,
``stop.max_failures``), a run's delivery step (``stop.after_notifications``) and
``changewatch resume`` (which clears it). Whoever pauses or resumes reports the
``not_paused`` asset check at once, so the UI shows the reason even though a paused source
has no runs.

A record is JSON under ``changewatch/pause/<kind>/<name>``: ``{"paused": true, "reason":
..., "at": epoch}``, or after a resume ``{"paused": false, "at": epoch}`` (notifications are
counted from then on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import dagster as dg

__all__ = [
    "NOT_PAUSED_CHECK",
    "Pause",
    "not_paused_result",
    "pause",
    "paused_reasons",
    "read_pauses",
    "resume",
    "stop_reason",
]

NOT_PAUSED_CHECK = "not_paused"

Kind = Literal["source", "watch"]


@dataclass(frozen=True)
class Pause:
    """One record: paused or not, why, and since when (epoch seconds)."""

    paused: bool
    reason: str = ""
    at: float = 0.0


def _key(kind: Kind, name: str) -> str:
    return f"changewatch/pause/{kind}/{name}"


def read_pauses(instance: dg.DagsterInstance, kind: Kind, names: Iterable[str]) -> dict[str, Pause]:
    """The records of ``names`` that have one (one query, whatever their number)."""
    keys = {_key(kind, name): name for name in names}
    if not keys:
        return {}
    found = {}
    for key, text in instance.run_storage.get_cursor_values(set(keys)).items():
        try:
            data = json.loads(text)
            found[keys[key]] = Pause(bool(data["paused"]), str(data.get("reason", "")), data["at"])
        except (ValueError, KeyError, TypeError):
            continue  # unreadable: as if never paused
    return found


def paused_reasons(
    instance: dg.DagsterInstance, kind: Kind, names: Iterable[str]
) -> dict[str, str]:
    """Name -> reason of those of ``names`` paused now."""
    return {n: p.reason for n, p in read_pauses(instance, kind, names).items() if p.paused}


def pause(
    instance: dg.DagsterInstance,
    kind: Kind,
    name: str,
    reason: str,
    *,
    asset: dg.AssetKey,
    now: float,
) -> None:
    """Pause ``name`` and fail its ``not_paused`` check with ``reason``."""
    record = {"paused": True, "reason": reason, "at": now}
    instance.run_storage.set_cursor_values({_key(kind, name): json.dumps(record)})
    instance.report_runless_asset_event(_evaluation(asset, kind, name, reason, now))


def resume(
    instance: dg.DagsterInstance, kind: Kind, name: str, *, asset: dg.AssetKey, now: float
) -> Pause | None:
    """Resume ``name`` if it is paused (its check passes again); the pause it had, or None."""
    was = read_pauses(instance, kind, [name]).get(name)
    if was is None or not was.paused:
        return None
    instance.run_storage.set_cursor_values(
        {_key(kind, name): json.dumps({"paused": False, "at": now})}
    )
    instance.report_runless_asset_event(_evaluation(asset, kind, name, None, now))
    return was


def _evaluation(
    asset: dg.AssetKey, kind: Kind, name: str, reason: str | None, now: float
) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=asset,
        check_name=NOT_PAUSED_CHECK,
        **not_paused_fields(kind, name, reason, now),
    )


def stop_reason(
    instance: dg.DagsterInstance, kind: Kind, name: str, deadline: float | None, now: float
) -> str | None:
    """Why ``name`` is stopped at ``now``: its ``stop.until`` (``deadline``) passed, or its
    pause record; None when it goes on."""
    if deadline is not None and now >= deadline:
        when = datetime.fromtimestamp(deadline, UTC).isoformat()
        return f"stop.until {when} has passed"
    record = read_pauses(instance, kind, [name]).get(name)
    return record.reason if record is not None and record.paused else None


def not_paused_result(
    kind: Kind, name: str, pauses: Mapping[str, Pause], now: float, reason: str | None = None
) -> dg.AssetCheckResult:
    """The ``not_paused`` check as a run of ``name`` reports it, from its pause record (or
    the ``reason`` it is stopped for, as ``stop_reason`` gave it)."""
    record = pauses.get(name)
    if reason is None and record is not None and record.paused:
        reason = record.reason
    at = record.at if record is not None and record.paused else now
    return dg.AssetCheckResult(
        check_name=NOT_PAUSED_CHECK, **not_paused_fields(kind, name, reason, at)
    )


def not_paused_fields(kind: Kind, name: str, reason: str | None, at: float) -> dict:
    """What a ``not_paused`` evaluation says: passed or not, why, and how to resume."""
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
    if reason is None:
        return {"passed": True, "description": f"{kind} {name} is not paused"}
    return {
        "passed": False,
        "description": f"paused since {when}: {reason}; `changewatch resume {name}` resumes it",
        "metadata": {"reason": reason, "paused_at": when},
    }
