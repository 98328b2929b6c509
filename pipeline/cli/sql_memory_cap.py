"""A bound on the memory this process may add while `changewatch sql` runs a DuckDB query.

DuckDB's ``memory_limit`` covers its buffer pool, not the values a function builds in one
step, nor the Arrow result: a query that builds big values on many rows took 2 GB. Within
``memory_cap`` the process's address space may grow by ``extra`` bytes at most (RLIMIT_AS),
so an allocation past it fails inside DuckDB ("bad allocation") or Python (``MemoryError``)
instead of the machine running out. The previous limit is restored afterwards.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["address_space", "memory_cap"]


def address_space() -> int:
    """Bytes of address space this process holds now (VmSize)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


@contextmanager
def memory_cap(extra: int) -> Iterator[None]:
    """Let the address space grow by at most ``extra`` bytes while the block runs (a lower
    limit already set stays)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = address_space() + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
