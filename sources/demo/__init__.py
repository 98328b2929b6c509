"""The demo API: a deterministic GitHub-like issue tracker served over HTTP.

It is changewatch's embedded default source and the main test fixture::

    from changewatch.sources.demo import DemoAPIServer, DemoTracker

    with DemoAPIServer(DemoTracker(issues=500, seed=1)) as server:
        ...  # GET f"{server.url}/repos/acme/widgets/issues?state=all"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from changewatch.sources.demo.tracker import DemoTracker

if TYPE_CHECKING:
    from changewatch.sources.demo.server import DemoAPIServer

__all__ = ["DemoAPIServer", "DemoTracker"]


def __getattr__(name: str) -> Any:
    # The server is imported on first use, not here:
    # `python -m changewatch.sources.demo.server` would otherwise find
    # the module already imported by this package and warn about it.
    if name == "DemoAPIServer":
        from changewatch.sources.demo.server import DemoAPIServer

        return DemoAPIServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
