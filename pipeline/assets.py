"""Sync assets: one per configured source, named after the table it writes."""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import dagster as dg
from dagster import AssetExecutionContext

from pipeline.resources import WarehouseResource
from sources import SourceConfig, build_source
from warehouse.schema import changes_table
from warehouse.sync import run_sync

__all__ = ["SOURCE_TAG", "WAREHOUSE_POOL", "sync_asset"]

# Every asset that writes the warehouse takes a slot in this pool (limit 1): a DuckDB file
# admits one writing process, and Dagster runs each run in its own process.
WAREHOUSE_POOL = "warehouse"
SOURCE_TAG = "changewatch/source"


def sync_asset(source: SourceConfig) -> dg.AssetsDefinition:
    """The asset that syncs ``source`` into its table and appends to its change log."""

    @dg.asset(
        name=source.table,
        group_name="sync",
        pool=WAREHOUSE_POOL,
        kinds={"python", "sql"},
        tags={SOURCE_TAG: source.name},
        description=(
            source.description
            or f"{source.name}: {source.type} source synced into table `{source.table}` "
            f"({source.sync}); every insert, update and delete is appended to "
            f"`{changes_table(source.table)}`."
        ),
        metadata={
            "source": source.name,
            "primary_key": ", ".join(source.primary_key),
            "cursor_column": source.updated_at or "",
            "change_log": changes_table(source.table),
            "dagster/table_name": source.table,
        },
    )
    def _sync(context: AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
        with warehouse.connect() as wh:
            stats = run_sync(wh, build_source(source), dagster_run_id=context.run.run_id)
        context.log.info(
            f"{source.name}: {stats.inserted} inserted, {stats.updated} updated, "
            f"{stats.deleted} deleted, {stats.unchanged} unchanged in {stats.duration_s}s"
        )
        return dg.MaterializeResult(
            metadata={
                "rows_fetched": stats.rows_fetched,
                "inserted": stats.inserted,
                "updated": stats.updated,
                "deleted": stats.deleted,
                "unchanged": stats.unchanged,
                "changed": stats.changed,
                "row_count": stats.row_count,
                "pages": stats.pages,
                "http_requests": stats.requests,
                "duration_s": dg.MetadataValue.float(stats.duration_s),
                "cursor": stats.cursor_after or "",
                "sync_id": stats.sync_id,
                "columns_added": ", ".join(stats.columns_added),
                "warehouse": warehouse.describe(),
            }
        )

    return _sync
