"""Constants shared by tests (a plain module: `conftest` names are ambiguous across folders)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# The Postgres server the tests use; they fail, never skip, when it is unreachable.
PG_URL = os.environ.get("CHANGEWATCH_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[1]


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
