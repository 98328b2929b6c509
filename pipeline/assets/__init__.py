"""The Dagster assets and their checks: one sync asset per source, then evaluations,
notifications and digests per watch, and the retention asset."""
