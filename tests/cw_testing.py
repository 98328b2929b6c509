"""Constants shared by tests (a plain module: `conftest` names are ambiguous across folders)."""

from __future__ import annotations

import os
from pathlib import Path

# The Postgres server the tests use; they fail, never skip, when it is unreachable.
PG_URL = os.environ.get("CHANGEWATCH_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[1]
