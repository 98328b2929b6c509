"""Errors the CLI reports in one line, and how any other expected failure is worded.

ChangewatchError
 +-- ConfigError     the watches file is invalid (``file:line: key: why``, one per problem)
 +-- UsageError      an unknown source, watch or digest name; a refused SQL query
 +-- RunFailed       a Dagster run failed: the failing step and its error, plus what did run

Errors of our other layers (``WarehouseError``, ``SourceError``, ``FilterRuntimeError``...)
already say what went wrong; library errors that users meet (DuckDB, PostgreSQL, sockets)
are worded by ``explain``. This module imports nothing heavy: ``changewatch --help`` loads it.
"""

from __future__ import annotations

import difflib
import errno
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "ChangewatchError",
    "ConfigError",
    "RunFailed",
    "UsageError",
    "did_you_mean",
    "explain",
    "named",
    "redact",
]


class ChangewatchError(Exception):
    """Base of the errors whose message is all a user needs."""

    exit_code = 1


class ConfigError(ChangewatchError):
    """The watches file is invalid; the message lists every problem as ``file:line: key: why``."""

    exit_code = 2


class UsageError(ChangewatchError):
    """The command names something that does not exist, or asks for something refused."""

    exit_code = 2


class RunFailed(ChangewatchError):
    """A Dagster run failed in ``step``; ``results`` holds the metadata of what succeeded
    and ``trace`` the run's own account of the error (shown with ``--debug``)."""

    def __init__(self, step: str, message: str, *, results: dict[str, Any], trace: str) -> None:
        super().__init__(f"{step} failed: {message}")
        self.step, self.results, self.trace = step, results, trace


# Our own errors raised inside the layers below the CLI: their message is the explanation.
_OWN = (
    "changewatch.warehouse.urls.WarehouseError",
    "changewatch.sources.errors.SourceError",
    "changewatch.evaluators.evaluate.FilterRuntimeError",
    "changewatch.evaluators.filters.FilterError",
    "changewatch.evaluators.judge.JudgeConfigError",
    "changewatch.evaluators.evals.EvalError",
    "changewatch.evaluators.feedback.FeedbackError",
    "changewatch.channels.feedback.FeedbackSecretMissing",
)
# user:password@ in any URL.
_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@", re.I)
_SECRET_PARAM = re.compile(r"(?P<key>[?&](?:password|sslpassword)=)[^&\s]+", re.I)


def redact(text: str) -> str:
    """``text`` without passwords in URLs.

    >>> redact("cannot connect to postgresql://app:s3cret@db/prod?password=x&sslmode=require")
    'cannot connect to postgresql://app@db/prod?password=***&sslmode=require'
    """
    text = _CREDENTIALS.sub(r"\g<scheme>\g<user>@", text)
    return _SECRET_PARAM.sub(r"\g<key>***", text)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the known name nearest ``name``, or nothing.

    >>> did_you_mean("paginatr", ["paginator", "params", "path"])
    "; did you mean 'paginator'?"
    >>> did_you_mean("zzz", ["paginator"])
    ''
    """
    nearest = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {nearest[0]!r}?" if nearest else ""


def named(known: Sequence[str], *, most: int = 10) -> str:
    """The known names as a list to read, the first ``most`` of a long one.

    >>> named(["a", "b"]), named([]), named([f"s{i}" for i in range(12)], most=2)
    ('a, b', 'none', 's0, s1 and 10 more')
    """
    if len(known) > most:
        return f"{', '.join(known[:most])} and {len(known) - most} more"
    return ", ".join(known) or "none"


def explain(error: BaseException) -> tuple[str, int] | None:
    """One line for an expected failure and the exit code, or None for an unexpected one."""
    if isinstance(error, ChangewatchError):
        return str(error), error.exit_code
    if _is_a(error, *_OWN):
        return _first_line(error), 1
    if (database := _library_error(error, "duckdb", "Error")) is not None:
        return f"DuckDB: {database}", 1
    if (database := _library_error(error, "adbc_driver_manager", "Error")) is not None:
        return f"PostgreSQL: {database.rpartition('ERROR:')[2].strip()}", 1
    if isinstance(error, OSError):
        reason = error.strerror or _first_line(error)
        if error.errno == errno.EADDRINUSE:
            reason += " (another process is listening on it)"
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{reason}", 1
    return None


def _is_a(error: BaseException, *names: str) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" in names for c in type(error).__mro__)


def _library_error(error: BaseException, module: str, name: str) -> str | None:
    # A library that was never imported cannot have raised: look it up, never import it.
    loaded = sys.modules.get(module)
    base = getattr(loaded, name, None)
    if isinstance(base, type) and isinstance(error, base):
        return _first_line(error)
    return None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
