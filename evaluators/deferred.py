"""A module imported at its first attribute use, for heavy libraries most processes never call."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Deferred"]


class Deferred:
    """Stands for the module ``name``: the first attribute read imports it.

    ``importlib.import_module`` takes the import lock, so threads racing to the first use
    import it once; afterwards each read is a ``sys.modules`` lookup.

    >>> json = Deferred("json")
    >>> json.dumps([1])
    '[1]'
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"Deferred({self._name!r})"
