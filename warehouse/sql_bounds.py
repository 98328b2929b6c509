"""Bounds on what one call in `changewatch sql` may build from small arguments.

Where it sits: ``read_guard`` admits a query's functions, then ``bound_builders`` bounds the
ones that build a large value from a few bytes of SQL (``repeat('x', 1000000000)``,
``lpad('x', 2e9, 'y')``, ``printf('%999999999d', 1)``, DuckDB's ``range(1e9)`` as a list).
DuckDB runs such a call in one step, which neither the ``--timeout`` watchdog's interrupt nor
its memory limit reaches: 55 s and 2 GB for the first. So a count written in the query past
``MAX_BUILT`` is refused before it runs, and on DuckDB a count computed at run time is checked
where the call is (``error()`` names the call). PostgreSQL bounds these itself (1 GB a
value; its ``statement_timeout`` ends the statement). The memory the whole query may take is
bounded where it runs (``pipeline.query``).
"""

from __future__ import annotations

import re

from sqlglot import exp

__all__ = ["MAX_BUILT", "MAX_NESTED_BUILDERS", "bound_builders"]

# Characters (or list elements) one call may build: a bar of a chart, a padded column.
MAX_BUILT = 1_000_000
# Builders within builders: a run-time check repeats its first argument once more per level.
MAX_NESTED_BUILDERS = 4
# In a printf/format pattern: a width or precision of five digits or more, one taken from an
# argument (* or a nested {}), or a literal brace (whose nesting is ambiguous).
_WIDE = re.compile(r"\d{5,}|\*|\{[^}]*\{")
_FORMATS = ("printf", "format")


def bound_builders(tree: exp.Expression, dialect: str) -> str | None:
    """Bound every building call in ``tree`` (in place); why it is refused, or None.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT repeat('x', 1000000000)", read="duckdb")
    >>> bound_builders(tree, "duckdb")
    "REPEAT('x', 1000000000) builds more than 1,000,000 characters or elements"
    >>> tree = sqlglot.parse_one("SELECT lpad(name, n) FROM t", read="duckdb")
    >>> bound_builders(tree, "duckdb") is None
    True
    >>> tree.sql("duckdb")  # doctest: +ELLIPSIS
    "SELECT LPAD(name, CASE WHEN n <= 1000000 THEN n ELSE ERROR('changewatch sql: lpad/rpad ...
    """
    for node in list(tree.find_all(exp.Repeat, exp.Pad, exp.GenerateSeries, exp.Format)):
        problem = _bound(node, dialect)
        if problem is not None:
            return problem
    for node in tree.find_all(exp.Anonymous):
        if node.name.lower() in _FORMATS:
            problem = _pattern_problem(node)
            if problem is not None:
                return problem
    return None


def _bound(node: exp.Expression, dialect: str) -> str | None:
    if isinstance(node, exp.Format):
        return _pattern_problem(node)
    if _depth(node) > MAX_NESTED_BUILDERS:
        return (
            f"{_snippet(node)} nests more than {MAX_NESTED_BUILDERS} string-building calls "
            "in one another"
        )
    if isinstance(node, exp.GenerateSeries):
        return _series_problem(node, dialect)
    key = "times" if isinstance(node, exp.Repeat) else "expression"
    count = node.args.get(key)
    if count is None:
        return None
    value = _literal(count)
    if value is not None and value > MAX_BUILT:
        return f"{_snippet(node)} builds more than {MAX_BUILT:,} characters or elements"
    if dialect == "duckdb" and value is None:
        node.set(key, _checked_count(node, count))
    return None


def _checked_count(node: exp.Expression, count: exp.Expression) -> exp.Expression:
    """``count``, or an error at run time when the call would build more than MAX_BUILT."""
    if isinstance(node, exp.Repeat):
        # The result is the first argument's length times the count.
        unit = exp.func("greatest", exp.Length(this=node.this.copy()), exp.Literal.number(1))
        limit: exp.Expression = exp.IntDiv(this=exp.Literal.number(MAX_BUILT), expression=unit)
        name = "repeat"
    else:
        limit, name = exp.Literal.number(MAX_BUILT), "lpad/rpad"
    message = (
        f"changewatch sql: {name} would build more than {MAX_BUILT:,} characters or elements "
        "(see docs/security.md)"
    )
    return exp.Case(
        ifs=[exp.If(this=exp.LTE(this=count.copy(), expression=limit), true=count.copy())],
        default=exp.Anonymous(this="error", expressions=[exp.Literal.string(message)]),
    )


def _series_problem(node: exp.GenerateSeries, dialect: str) -> str | None:
    # In FROM, a series streams row by row; as a value (DuckDB's list) it is built at once.
    if dialect != "duckdb" or isinstance(node.parent, exp.Table):
        return None
    start, end = _literal(node.args.get("start")), _literal(node.args.get("end"))
    step = _literal(node.args.get("step")) if node.args.get("step") else 1
    if start is not None and end is not None and step:
        if abs(end - start) / abs(step) <= MAX_BUILT:
            return None
    return (
        f"{_snippet(node)} as a value builds its whole list at once: give literal bounds of at "
        f"most {MAX_BUILT:,} elements, or select FROM it, where it streams"
    )


def _pattern_problem(node: exp.Expression) -> str | None:
    pattern = node.this if isinstance(node, exp.Format) else (node.expressions or [None])[0]
    if not isinstance(pattern, exp.Literal) or not pattern.is_string:
        return f"{_snippet(node)}: the pattern of printf/format must be a string literal"
    if _WIDE.search(pattern.this):
        return (
            f"{_snippet(node)}: a width or precision past 4 digits, or one taken from an "
            "argument, is not allowed in a printf/format pattern"
        )
    return None


def _depth(node: exp.Expression) -> int:
    """How many building calls ``node`` is within, itself included."""
    builders = (exp.Repeat, exp.Pad)
    return sum(1 for n in [node, *_ancestors(node)] if isinstance(n, builders))


def _ancestors(node: exp.Expression):
    while node.parent is not None:
        node = node.parent
        yield node


def _literal(node: exp.Expression | None) -> float | None:
    """A numeric literal's value (a sign in front included), else None."""
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    try:
        value = float(node.this)
    except ValueError:
        return None
    return -value if negative else value


def _snippet(node: exp.Expression) -> str:
    text = node.sql(comments=False)
    return text if len(text) <= 60 else text[:57] + "..."
