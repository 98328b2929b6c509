"""The ``no_rejected_records`` asset check of a source whose ``on_bad_record`` is ``skip``.

A warning, not a failure: the sync stored everything else, and the records it left out are
listed in table ``rejected_records`` (``warehouse.rejections``) and asked for again by the next
sync. Declared only for ``skip`` sources, whose syncs are the only ones that reject.
"""

import dagster as dg
from changewatch.sources import SourceConfig
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.rejections import count_rejected

__all__ = [
    "REJECTED_CHECK",
    "fleet_rejected_check_result",
    "rejected_check_result",
    "rejected_check_specs",
    "rejected_check_unknown",
]

REJECTED_CHECK = "no_rejected_records"


def rejected_check_specs(source: SourceConfig) -> list[dg.AssetCheckSpec]:
    """The check's spec for ``source``, if it skips bad records."""
    if source.on_bad_record != "skip":
        return []
    return [
        dg.AssetCheckSpec(
            REJECTED_CHECK,
            asset=source.table,
            description=(
                "Warns while the last sync left records out (on_bad_record: skip): see "
                f'`changewatch sql "SELECT * FROM rejected_records WHERE source = '
                f"'{source.name}'\"`; the next sync asks for them again."
            ),
        )
    ]


def rejected_check_result(wh: Warehouse, source: SourceConfig) -> dg.AssetCheckResult:
    """The check as the source's last committed sync left it."""
    return _result(*count_rejected(wh, source.name))


def fleet_rejected_check_result(wh: Warehouse, members: list[str]) -> dg.AssetCheckResult:
    """The check of a fleet's run, over the targets it synced (``members``: their names)."""
    counts = [count_rejected(wh, member) for member in members]
    firsts = [f"{m}: {first}" for m, (count, first) in zip(members, counts, strict=True) if count]
    return _result(sum(count for count, _ in counts), firsts[0] if firsts else None)


def _result(count: int, first: str | None) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=REJECTED_CHECK,
        passed=count == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"rejected_records": count},
        description=(
            f"{count} record(s) rejected by the last sync (the first: {first}); they are in "
            "table rejected_records and retried by the next sync"
            if count
            else "the last sync stored every record"
        ),
    )


def rejected_check_unknown(source: SourceConfig, error: BaseException) -> dg.AssetCheckResult:
    """The check beside a failed sync whose rejections could not be read: not evaluated."""
    return dg.AssetCheckResult(
        check_name=REJECTED_CHECK,
        passed=True,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"evaluated": False},
        description=(
            f"not evaluated: the sync failed and {source.name}'s rejected records could not be "
            f"read ({type(error).__name__}; the run's failure says more)"
        ),
    )
