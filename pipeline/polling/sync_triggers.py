"""Which trigger syncs a source: its cron schedule, the sync sensor, or the demo API's sensor.

Read by the sensors (which one a source gets) and by the freshness policies (a source only
has a clock when its trigger starts running); it imports neither, so both can import it.
"""

from __future__ import annotations

from changewatch.sources import SourceConfig

__all__ = ["DEMO_API_URL", "is_demo_source", "scheduled_by_default"]

# Where `changewatch demo-api` serves by default. The bundled watches.yaml points there when
# no demo is running, so a source at this address only works while someone serves it.
DEMO_API_URL = "http://127.0.0.1:8765"


def is_demo_source(source: SourceConfig) -> bool:
    """Whether ``source`` reads the demo API at its default address."""
    return str(getattr(source, "base_url", "")).rstrip("/") == DEMO_API_URL


def scheduled_by_default(source: SourceConfig) -> bool:
    """Whether a trigger that starts running syncs ``source``: its cron schedule, or the sync
    sensor; not the demo API's sensor, which starts stopped until someone serves the API."""
    return source.cron is not None or not is_demo_source(source)
