"""One signature per asset function's code: Dagster reads it some 17 times per asset it builds."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import CodeType
from typing import TypeVar

__all__ = ["shared_signature"]

F = TypeVar("F", bound=Callable)

_SIGNATURES: dict[CodeType, inspect.Signature] = {}


def shared_signature(fn: F) -> F:
    """Give ``fn`` the signature every function made from its code has, worked out once.

    Building an asset, Dagster asks for its function's signature (context, resources, inputs,
    return type) some 17 times, and ``inspect.signature`` works it out afresh each time
    (0.03 ms): a quarter of building a source's assets, which every run and code server pays
    for every source in the file (bench/bench_definitions.py). The asset functions of a
    module are closures of one ``def``, so they share parameters and annotations; an explicit
    ``__signature__`` is what ``inspect.signature`` (and Dagster, for the annotations) reads
    first. A function with defaults keeps its own: defaults differ between closures.

    >>> def make(n):
    ...     def f(context, warehouse): return str(n)
    ...     return shared_signature(f)
    >>> a, b = make(1), make(2)
    >>> a.__signature__ is b.__signature__, str(inspect.signature(b)), b(None, 0)
    (True, '(context, warehouse)', '2')
    """
    if fn.__defaults__ is not None or fn.__kwdefaults__ is not None:
        return fn
    signature = _SIGNATURES.get(fn.__code__)
    if signature is None:
        signature = _SIGNATURES[fn.__code__] = inspect.signature(fn)
    fn.__signature__ = signature  # type: ignore[attr-defined]
    return fn
