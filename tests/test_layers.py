"""The layers of ARCHITECTURE.md hold: no package, and no room of pipeline/, imports upward."""

from __future__ import annotations

import ast

from cw_testing import REPO

# Lowest first: a package may import only itself and the ones before it.
PACKAGES = ["sql", "sources", "warehouse", "channels", "evaluators", "pipeline"]
# pipeline/'s rooms, lowest first: a room may import only itself and the ones before it.
ROOMS = ["project", "polling", "webhooks", "assets", "triggers", "definitions", "cli"]


def _rank(dotted: list[str]) -> tuple[int, int]:
    package = PACKAGES.index(dotted[0])
    in_room = dotted[0] == "pipeline" and len(dotted) > 1 and dotted[1] in ROOMS
    room = ROOMS.index(dotted[1]) if in_room else -1
    return package, room


def _upward_imports() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[0] == "pipeline" and len(parts) > 2 and parts[1] not in ROOMS:
                found.append(f"{path.relative_to(REPO)}: not in a room ARCHITECTURE.md names")
                continue
            mine = _rank(list(parts))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.ImportFrom) and node.module or "").startswith(
                    "changewatch."
                ):
                    continue
                theirs = _rank(node.module.split(".")[1:])
                upward = theirs[0] > mine[0] or (
                    theirs[0] == mine[0] == PACKAGES.index("pipeline") and theirs[1] > mine[1] >= 0
                )
                if upward:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {node.module}")
    return found


def test_nothing_imports_upward() -> None:
    assert _upward_imports() == []


def test_pipeline_has_no_loose_modules() -> None:
    """Every module of pipeline/ lives in a room (its package docstring aside)."""
    loose = sorted(p.name for p in (REPO / "pipeline").glob("*.py") if p.name != "__init__.py")
    assert loose == []


def test_only_pipeline_imports_dagster() -> None:
    offenders = [
        str(path.relative_to(REPO))
        for package in PACKAGES
        if package != "pipeline"
        for path in (REPO / package).rglob("*.py")
        if any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and any(
                name.split(".")[0] == "dagster"
                for name in (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
            )
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert offenders == []
