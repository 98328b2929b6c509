"""Write the json-server database the json-server tests start from.

``python tests/jsonserver/make_db.py db.json`` writes it by hand; the tests call ``build``.
Timestamps are whole-second UTC ISO strings ending in ``Z``, the shape changewatch stores its
cursor in, so json-server's ``updatedAt_gte=<cursor>`` (a string comparison) filters right.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

START = datetime(2024, 1, 1, tzinfo=UTC)
STATUSES = ("open", "closed", "pending")
TAGS = ("red", "green", "blue", "yellow")


def iso(moment: datetime) -> str:
    """``2024-01-01T00:00:00Z``."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def build(items: int = 250) -> dict[str, Any]:
    """``items`` items (ids 1.., one minute apart) and 0-2 comments per item (``itemId``)."""
    rows = [
        {
            "id": i,
            "title": f"Item {i}",
            "status": STATUSES[i % 3],
            "tags": [TAGS[i % 4], TAGS[(i * 7) % 4]] if i % 5 else [],
            "updatedAt": iso(START + timedelta(minutes=i)),
        }
        for i in range(1, items + 1)
    ]
    comments = [
        {
            "id": len(rows) * n + i,
            "itemId": i,
            "body": f"comment {n} on item {i}",
            "updatedAt": iso(START + timedelta(minutes=i, seconds=n + 1)),
        }
        for i in range(1, items + 1)
        for n in range(i % 3)
    ]
    return {"items": rows, "comments": comments}


def write(path: Path, items: int = 250) -> dict[str, Any]:
    """Write ``build(items)`` to ``path``; return it."""
    data = build(items)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return data


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "db.json"))
