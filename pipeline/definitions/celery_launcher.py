"""Runs on worker hosts: dagster-celery's run launcher, told when a worker's host is gone.

``CeleryRunLauncher`` sends each run to a Celery queue; a worker on any host takes it and runs
it in its own process. Run monitoring asks the launcher whether a run's worker lives, and the
stock answer is the task's state in the result backend: a worker killed with its host never
writes another, so its task says STARTED forever and the run would hang. This launcher asks
the worker itself (a Celery ``ping`` over the broker, addressed to the node that started the
task): no answer within ``ping_timeout`` seconds, ``worker_misses`` checks in a row, and the
run is reported failed, so run retries place it on a living worker. deploy/dagster-celery.yaml
selects it; the workers load the same instance settings (pipeline/definitions/celery_worker.py), so
the launcher and its workers never disagree on the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery
from dagster import Field, IntSource
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun
from dagster_celery.launcher import CeleryRunLauncher
from dagster_celery.tags import DAGSTER_CELERY_TASK_ID_TAG
from dagster_celery.tasks import create_execute_job_task, create_resume_job_task

__all__ = ["HostCeleryRunLauncher"]

PING_TIMEOUT_S = 2
WORKER_MISSES = 2


class HostCeleryRunLauncher(CeleryRunLauncher):
    """``CeleryRunLauncher`` whose health check pings the worker running the run."""

    def __init__(
        self,
        *args: Any,
        ping_timeout: int = PING_TIMEOUT_S,
        worker_misses: int = WORKER_MISSES,
        **kwargs: Any,
    ) -> None:
        self.ping_timeout = ping_timeout
        self.worker_misses = worker_misses
        # Misses in a row per run: one lost ping (a busy broker) must not fail a run.
        self._misses: dict[str, int] = {}
        super().__init__(*args, **kwargs)

    @classmethod
    def config_type(cls) -> dict:
        return {
            **super().config_type(),
            "ping_timeout": Field(IntSource, is_required=False, default_value=PING_TIMEOUT_S),
            "worker_misses": Field(IntSource, is_required=False, default_value=WORKER_MISSES),
        }

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, **config_value)

    def worker_app(self) -> Celery:
        """The Celery app a worker host runs: this launcher's broker, backend and queues."""
        create_execute_job_task(self.celery)
        create_resume_job_task(self.celery)
        return self.celery

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        health = super().check_run_worker_health(run)
        if health.status != WorkerStatus.RUNNING:
            return health
        started = self.celery.AsyncResult(run.tags[DAGSTER_CELERY_TASK_ID_TAG]).info
        node = started.get("hostname") if isinstance(started, dict) else None
        if node is None:
            return health
        if self.celery.control.ping(destination=[node], timeout=self.ping_timeout):
            self._misses.pop(run.run_id, None)
            return health
        misses = self._misses[run.run_id] = self._misses.get(run.run_id, 0) + 1
        if misses < self.worker_misses:
            return health
        del self._misses[run.run_id]
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"celery worker {node} did not answer {misses} pings of {self.ping_timeout} s: "
            "its host is lost",
        )
