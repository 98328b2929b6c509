"""Constants shared by tests (a plain module: `conftest` names are ambiguous across folders)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# The Postgres server the tests use; they fail, never skip, when it is unreachable.
PG_URL = os.environ.get("CHANGEWATCH_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[1]


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database on PG_URL's server, named ``prefix`` and a random suffix; the
    URL to it (PG_URL's, another path, no query). Dropped on leaving, sessions and all."""
    import psycopg2

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with closing(psycopg2.connect(PG_URL)) as admin:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}", query=""))
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def demo_source_settings(base_url: str, columns: dict[str, Any], **overrides: Any) -> dict:
    """Settings of a REST source over the demo API's issue list (Link-header pages)."""
    settings: dict[str, Any] = {
        "name": "demo_issues",
        "type": "rest",
        "table": "issues",
        "base_url": base_url,
        "path": "/repos/acme/widgets/issues",
        "params": {"state": "all", "per_page": 100},
        "paginator": {"type": "link_header"},
        "primary_key": "number",
        "updated_at": "updated_at",
        "columns": columns,
        # Most tests follow changes from the very first sync; the silent default has its own.
        "baseline": "evaluate",
    }
    return settings | overrides
