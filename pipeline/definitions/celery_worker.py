"""The Celery app a worker host runs (`celery -A` this module `worker`).

Celery's ``-A`` wants a module holding the app, so it is built when the module is imported
(by the worker only): from the run launcher of the Dagster instance in $DAGSTER_HOME
(deploy/dagster-celery.yaml), the one the daemon launches with, so both use one broker.
"""

from __future__ import annotations

import dagster as dg
from changewatch.pipeline.definitions.celery_launcher import HostCeleryRunLauncher

__all__ = ["app"]


def _app():
    with dg.DagsterInstance.get() as instance:
        launcher = instance.run_launcher
        if not isinstance(launcher, HostCeleryRunLauncher):
            raise SystemExit(
                f"$DAGSTER_HOME/dagster.yaml: run_launcher is {type(launcher).__name__}, "
                "not HostCeleryRunLauncher (see deploy/dagster-celery.yaml)"
            )
        return launcher.worker_app()


app = _app()
