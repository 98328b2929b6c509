"""Fixtures of the pipeline tests: a database of its own for Dagster's storage."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from cw_testing import fresh_database  # the warehouse tests' server: if it is down, these fail too


@pytest.fixture
def dagster_db() -> Iterator[str]:
    """A fresh PostgreSQL database for Dagster's storage; the psycopg2 URL to it."""
    with fresh_database("changewatch_dagster_test") as url:
        yield urlunsplit(urlsplit(url)._replace(scheme="postgresql+psycopg2"))
