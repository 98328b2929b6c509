"""Fixtures of the pipeline tests: a database of its own for Dagster's storage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from cw_testing import PG_URL  # the warehouse tests' server: if it is down, these fail too


@pytest.fixture
def dagster_db() -> Iterator[str]:
    """A fresh PostgreSQL database for Dagster's storage; the psycopg2 URL to it."""
    name = f"changewatch_dagster_test_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(PG_URL)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(PG_URL)
        yield urlunsplit(parts._replace(scheme="postgresql+psycopg2", path=f"/{name}", query=""))
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.close()
