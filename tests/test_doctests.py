"""The `>>>` examples in the packages' docstrings run, so they stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

# Modules that need the `learn` extra (numpy, scikit-learn, sentence-transformers) at import:
# their examples run in tests/learn/test_learn_doctests.py, in the venv that has it.
LEARN_EXTRA = frozenset(
    f"changewatch.evaluators.{name}"
    for name in (
        "cross_validate", "learned", "learned_features", "learned_selection", "learned_structure",
        "learned_training",
    )
)
PACKAGES = tuple(
    f"changewatch.{name}"
    for name in ("sources", "warehouse", "evaluators", "channels", "pipeline", "sql")
)


def modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            names.append(info.name)
    # pipeline.definitions.code_location loads ./watches.yaml when imported; the celery modules
    # need the `hosts` extra (tested in tests/hosts), and celery_worker builds its Celery app
    # from $DAGSTER_HOME; none has examples to run.
    skipped = {
        "changewatch.pipeline.definitions.code_location",
        "changewatch.pipeline.definitions.celery_launcher",
        "changewatch.pipeline.definitions.celery_worker",
        *LEARN_EXTRA,
    }
    return sorted(n for n in names if n not in skipped)


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
