"""Everything Dagster: the assets, sensors and code location, in rooms by capability, and the
`changewatch` command. The only package that imports Dagster (ARCHITECTURE.md has the map)."""
