"""A fleet's targets as settings: a list of values, or a SQL query over a synced table.

Where it sits: in the config of a source that covers many similar targets (``for_each`` of a
``rest`` source, ``repos``/``repos_query`` of a ``github`` source marked ``fleet``). The
expansion of a fleet into one sync per target is ``sources/fleet.py``; a query's targets are
read inside a run (``pipeline/triggers/fleet_assets.py``), never while the file loads or in a sensor
(a DuckDB warehouse may be held by a run).
"""

from __future__ import annotations

import re
from urllib.parse import quote

import sqlglot
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlglot import exp
from sqlglot.errors import SqlglotError

__all__ = [
    "MAX_TARGET_CHARS",
    "TARGET_PLACEHOLDER",
    "ForEach",
    "check_target",
    "fill_target",
    "placeholder_problem",
    "schedule_problem",
    "query_tables",
]

# `{target}` in a REST fleet's path or string params: one target's value.
TARGET_PLACEHOLDER = "{target}"
# A target names a Dagster partition too: Dagster refuses these in a partition key.
_BAD_IN_KEY = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")
# Targets are names (a repository, a tenant, a region), not documents: this long at most.
MAX_TARGET_CHARS = 200


def check_target(value: object) -> str:
    """``value`` as a target, or ``ValueError`` saying why it cannot be one.

    >>> check_target("acme/widgets")
    'acme/widgets'
    >>> check_target("a...b")
    Traceback (most recent call last):
    ...
    ValueError: target 'a...b' holds '...', which a Dagster partition key cannot
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"target {value!r} is not a non-empty string")
    if len(value) > MAX_TARGET_CHARS:
        raise ValueError(f"target {value[:40]!r}... is longer than {MAX_TARGET_CHARS} characters")
    bad = next((part for part in _BAD_IN_KEY if part in value), None)
    if bad is not None:
        raise ValueError(f"target {value!r} holds {bad!r}, which a Dagster partition key cannot")
    return value


def fill_target(template: str, target: str, *, in_path: bool) -> str:
    """``template`` with ``{target}`` replaced; in a path the value is URL-escaped but for
    ``/`` (so ``owner/name`` fills ``/repos/{target}/issues``).

    >>> fill_target("/repos/{target}/issues", "acme/a b", in_path=True)
    '/repos/acme/a%20b/issues'
    >>> fill_target("{target}", "eu west", in_path=False)
    'eu west'
    """
    value = quote(target, safe="/") if in_path else target
    return template.replace(TARGET_PLACEHOLDER, value)


def query_tables(query: str) -> list[str]:
    """The tables a targets query reads (lowercase, CTEs left out), or ``ValueError``.

    Checked once more against the warehouse's own tables by ``read_guard`` in the run that
    resolves the query; here only that it is one read whose tables can be named.

    >>> query_tables("SELECT DISTINCT full_name FROM org_repos WHERE NOT archived")
    ['org_repos']
    """
    try:
        statements = [s for s in sqlglot.parse(query, read="postgres") if s is not None]
    except SqlglotError as error:
        raise ValueError(f"cannot parse the targets query: {str(error).splitlines()[0]}") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        raise ValueError("the targets query must be one SELECT (or WITH ... SELECT)")
    tree = statements[0]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = {t.name.lower() for t in tree.find_all(exp.Table) if t.name} - ctes
    if not tables:
        raise ValueError("the targets query reads no table: list the values instead")
    return sorted(tables)


class ForEach(BaseModel):
    """A fleet's targets: ``values`` (a list in the file) or ``query`` (its first column,
    read from the warehouse by each run of the fleet; nulls and repeats dropped)."""

    model_config = ConfigDict(extra="forbid")

    values: list[str] | None = Field(default=None, min_length=1, description="The targets, listed.")
    query: str | None = Field(
        default=None,
        description=(
            "A SELECT over synced tables whose first column lists the targets, read by each run."
        ),
    )

    @field_validator("values")
    @classmethod
    def _targets(cls, values: list[str] | None) -> list[str] | None:
        if values is None:
            return None
        for value in values:
            check_target(value)
        if len(set(values)) != len(values):
            raise ValueError("values lists a target twice")
        return values

    @field_validator("query")
    @classmethod
    def _read(cls, query: str | None) -> str | None:
        if query is not None:
            query_tables(query)
        return query

    @model_validator(mode="after")
    def _one_kind(self) -> ForEach:
        if (self.values is None) == (self.query is None):
            raise ValueError("for_each takes either values: [...] or query: SELECT ...")
        return self


# `{target}` anywhere but whole: `{targets}`, `{ target }` are typos, not placeholders.
_NEAR_MISS = re.compile(r"\{\s*target[^}]*\}")


def schedule_problem(cron: str | None, reconcile: str | None) -> str | None:
    """Why a fleet cannot take these schedules, or None: its runs name their targets
    (partitions), which only the fleet sensor's interval runs do so far.

    >>> schedule_problem(None, None) is None, schedule_problem("0 * * * *", None)
    (True, 'a fleet syncs at its interval: cron: and reconcile: are not supported for fleets')
    """
    if cron is None and reconcile is None:
        return None
    return "a fleet syncs at its interval: cron: and reconcile: are not supported for fleets"


def placeholder_problem(templates: list[str]) -> str | None:
    """Why ``templates`` (a path and string params) cannot take a target, or None.

    >>> placeholder_problem(["/repos/{target}/issues"]) is None
    True
    >>> placeholder_problem(["/repos/{targets}/issues"])
    "no {target} in the path or params (found '{targets}')"
    """
    if any(TARGET_PLACEHOLDER in t for t in templates):
        return None
    near = next((m.group(0) for t in templates if (m := _NEAR_MISS.search(t))), None)
    found = f" (found {near!r})" if near else ""
    return f"no {TARGET_PLACEHOLDER} in the path or params{found}"
