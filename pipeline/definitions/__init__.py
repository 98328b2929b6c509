"""Assembling a code location: Definitions from a watches file, the module `workspace.yaml`
loads, the Dagster Component, the threaded executor and the pooled PostgreSQL storage."""
