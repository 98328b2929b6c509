"""The `>>>` examples of the modules that need the `learn` extra, run where it is installed."""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_doctests import LEARN_EXTRA  # noqa: E402


@pytest.mark.parametrize("name", sorted(LEARN_EXTRA))
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
