"""An executor that runs a run's ready steps on a few threads of the run's own process.

A batched sync run (pipeline/definitions/build_definitions.py) carries many sources. Its syncs wait
on HTTP most of the time, so on a PostgreSQL warehouse (which takes many writers) they overlap well
in threads, while each step in its own process (Dagster's multiprocess executor) would pay the
start-up a batch exists to save. Steps still start in dependency order, claim their pools and
report every event through the run as the in-process executor does: the steps' events go to
one queue, and only this (the run's) thread tells Dagster's execution state about them.
Requests to one host stay bounded by the HTTP layer's per-host gate (sources/ratelimit.py).

This leans on Dagster's plan-execution internals (the same ones its own executors use); the
dagster pin in pyproject.toml (<1.14) keeps them fixed.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import dagster_event_sequence_for_step
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.base import Executor
from dagster._utils.error import serializable_error_info_from_exc_info

__all__ = ["DEFAULT_THREADS", "THREADS_ENV", "threaded_executor", "threads_from_env"]

# How many steps of one run may run at once, unless the environment says otherwise.
THREADS_ENV = "CHANGEWATCH_SYNC_CONCURRENCY"
DEFAULT_THREADS = 4

_DONE = object()  # a step's thread put all its events


def threads_from_env(environ: dict[str, str] | None = None) -> int:
    """``CHANGEWATCH_SYNC_CONCURRENCY`` (a whole number from 1), or 4.

    >>> threads_from_env({}), threads_from_env({"CHANGEWATCH_SYNC_CONCURRENCY": "8"})
    (4, 8)
    """
    raw = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if not raw:
        return DEFAULT_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{THREADS_ENV} must be a whole number from 1, got {raw!r}")
    return int(raw)


@dg.executor(
    name="threaded",
    config_schema={
        "max_concurrent": dg.Field(
            int, default_value=DEFAULT_THREADS, description="Steps running at once."
        )
    },
)
def threaded_executor(init_context: dg.InitExecutorContext) -> Executor:
    """Runs a run's steps in its own process, up to ``max_concurrent`` at once on threads."""
    return ThreadedExecutor(max_concurrent=init_context.executor_config["max_concurrent"])


class ThreadedExecutor(Executor):
    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent

    @property
    def retries(self) -> RetryMode:
        return RetryMode.DISABLED

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        yield DagsterEvent.engine_event(
            plan_context,
            f"Executing steps in process (pid: {os.getpid()}), "
            f"up to {self.max_concurrent} at once on threads",
            event_specific_data=EngineEventData.in_process(
                os.getpid(), execution_plan.step_keys_to_execute
            ),
        )
        yield from iter(
            ExecuteRunWithPlanIterable(
                execution_plan=plan_context.execution_plan,
                iterator=self._steps,
                execution_context_manager=PlanExecutionContextManager(
                    job=plan_context.job,
                    retry_mode=plan_context.retry_mode,
                    execution_plan=plan_context.execution_plan,
                    run_config=plan_context.run_config,
                    dagster_run=plan_context.dagster_run,
                    instance=plan_context.instance,
                    raise_on_error=plan_context.raise_on_error,
                    output_capture=plan_context.output_capture,
                ),
            )
        )

    def _steps(
        self, job_context: PlanExecutionContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        events: queue.Queue = queue.Queue()
        running: set[str] = set()
        with (
            InstanceConcurrencyContext(job_context.instance, job_context.dagster_run) as claims,
            execution_plan.start(
                retry_mode=job_context.retry_mode,
                max_concurrent=self.max_concurrent,
                instance_concurrency_context=claims,
            ) as active,
            ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="step") as threads,
        ):
            while not active.is_complete or running:
                if active.check_for_interrupts():
                    # The run is being stopped: start nothing more, let the running steps end
                    # (each sync has its own deadline).
                    active.mark_interrupted()
                for step in active.get_steps_to_execute(limit=self.max_concurrent - len(running)):
                    running.add(step.key)
                    context = job_context.for_step(step, active.get_known_state())
                    threads.submit(_run_step, context, step.key, events)
                yield from active.concurrency_event_iterator(job_context)
                if not running:
                    # Nothing in flight and nothing ready: a pool slot or a retry is awaited.
                    active.sleep_til_ready()
                    continue
                try:
                    key, event = events.get(timeout=1.0)
                except queue.Empty:
                    continue  # look again for steps whose pool slot came free
                if event is _DONE:
                    running.discard(key)
                    active.verify_complete(job_context, key)
                    yield from active.plan_events_iterator(job_context)
                    continue
                yield event
                active.handle_event(event)


def _run_step(context, key: str, events: queue.Queue) -> None:
    """Run one step on this thread, putting its events (and then ``_DONE``) on ``events``."""
    try:
        for event in dagster_event_sequence_for_step(context):
            events.put((key, event))
    except BaseException:  # Dagster turns a step's own errors into events; this is its own
        error = serializable_error_info_from_exc_info(sys.exc_info())
        events.put(
            (
                key,
                DagsterEvent.engine_event(
                    context,
                    f"step {key} stopped on thread {threading.current_thread().name}",
                    EngineEventData.engine_error(error),
                ),
            )
        )
    finally:
        events.put((key, _DONE))
