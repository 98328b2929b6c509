"""A watch's ``where``: one SQL condition over one change, checked at config load.

The language
------------
``where`` is a single SQL boolean expression (PostgreSQL syntax) evaluated against one row of
the source's change log. It may use only:

- ``kind`` (``'insert'``, ``'update'`` or ``'delete'``), ``object_key`` (the object's key as
  text) and ``detected_at`` (when the sync saw the change);
- ``old.<col>`` and ``new.<col>`` for every declared column of the source: the value before
  and after the change (the old values are NULL for an insert, the new ones for a delete);
- a bare ``<col>``: the object's current value, i.e. the new one, or the old one for a delete;
- ``changed(<col>)``: TRUE when that column changed; always TRUE for inserts and deletes;
- ``<value> IN <array column>``: the array contains the value, e.g. ``'bug' IN labels``,
  ``'security' IN new.labels AND NOT 'security' IN old.labels``; NULL when the array is NULL.
  ``x IN ('a', 'b')`` keeps its usual meaning;
- literals (``'text'``, numbers, TRUE/FALSE, NULL, ``INTERVAL '1 day'``,
  ``TIMESTAMP '2024-01-01'``), comparisons, AND/OR/NOT, IS [NOT] NULL,
  IS [NOT] DISTINCT FROM, BETWEEN, [NOT] LIKE/ILIKE [ESCAPE], ``+ - * / %``, ``||``,
  CASE, parentheses and CAST (or ``::``) to text, varchar, integer, bigint, smallint, double
  precision, real, numeric, boolean, date, timestamp, timestamptz or interval;
- the functions lower, upper, length, trim, coalesce, nullif, abs, round, greatest, least,
  now() / current_timestamp and ``cardinality(<array column>)`` (number of elements).

``/`` always divides as real numbers (``3 / 2`` is 1.5) and ``round`` rounds halves away from
zero, on both DuckDB and PostgreSQL. Names are case-insensitive unless double-quoted; a
declared column called ``kind``, ``object_key`` or ``detected_at`` is reachable only as
``old.<col>`` / ``new.<col>``. Examples::

    kind = 'update' AND old.state = 'open' AND new.state = 'closed'
    'bug' IN labels AND changed(labels)
    title ILIKE '%crash%' AND detected_at > now() - INTERVAL '1 day'

Anything else is refused when the configuration loads, with a ``FilterError`` naming the watch
and the offending part: other functions (file readers such as read_csv, settings, aggregates,
window functions), subqueries, statements, ``;``, comments, parameters, ``*``, other tables or
columns. The check is deny by default: every node of the parsed expression must be of an
allowed kind, and the SQL that runs is generated from that checked tree, never from the text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import sqlglot
from changewatch.warehouse.sql_functions import FUNCTIONS
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError

if TYPE_CHECKING:
    import duckdb

__all__ = ["CompiledFilter", "FilterError", "compile_filter"]

READ_DIALECT = "postgres"
MAX_LENGTH = 10_000
# Columns of the change row itself (name -> changewatch type).
CHANGE_FIELDS = {"kind": "text", "object_key": "text", "detected_at": "timestamp"}
QUALIFIERS = ("old", "new")
# Functions of this language that sqlglot leaves anonymous; each takes one column.
OWN_FUNCTIONS = ("changed", "cardinality")
CONDITIONS: tuple[type[exp.Expression], ...] = (
    exp.And,
    exp.Or,
    exp.Not,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.Is,
    exp.Between,
    exp.In,
    exp.Like,
    exp.ILike,
    exp.Escape,
    exp.Boolean,
    exp.Null,
)
# Every node type a filter may contain (exact types, not subclasses): deny by default.
ALLOWED_NODES: frozenset[type[exp.Expression]] = frozenset(
    {
        *CONDITIONS,
        *FUNCTIONS,
        exp.Anonymous,  # only OWN_FUNCTIONS, checked by name
        exp.Column,
        exp.Identifier,
        exp.Literal,
        exp.Paren,
        exp.Add,
        exp.Sub,
        exp.Mul,
        exp.Div,
        exp.Mod,
        exp.Neg,
        exp.DPipe,
        exp.Case,
        exp.If,
        exp.Cast,
        exp.DataType,
        exp.Interval,
        exp.Var,
    }
)
# Node types allowed only as a part of another.
ONLY_UNDER: dict[type[exp.Expression], type[exp.Expression]] = {
    exp.Identifier: exp.Column,
    exp.If: exp.Case,
    exp.DataType: exp.Cast,
    exp.Var: exp.Interval,
}
_T = exp.DataType.Type
CAST_TYPES = frozenset(
    {
        _T.TEXT,
        _T.VARCHAR,
        _T.INT,
        _T.BIGINT,
        _T.SMALLINT,
        _T.DOUBLE,
        _T.FLOAT,
        _T.DECIMAL,
        _T.BOOLEAN,
        _T.DATE,
        _T.TIMESTAMP,
        _T.TIMESTAMPTZ,
        _T.INTERVAL,
    }
)
STATEMENTS = tuple(
    getattr(exp, name)
    for name in (
        "Query DDL DML Drop Command Set Pragma Copy Use Attach Detach Alter Transaction Commit "
        "Rollback Describe Show Merge Grant Revoke Analyze Install Summarize Kill Cache Uncache "
        "Refresh Comment TruncateTable LoadData Export Declare Execute"
    ).split()
    if hasattr(exp, name)
)
_ALIAS = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(")


class FilterError(ValueError):
    """A watch's ``where`` is not a valid filter; the message names the watch and the part.

    ``problem`` is the message without the watch and ``where:``, for a caller that already
    names them (the config's ``file:line: watches[i].where:``).
    """

    def __init__(self, watch: str, problem: str) -> None:
        super().__init__(f"watch {watch!r}: where: {problem}")
        self.watch, self.problem = watch, problem


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class CompiledFilter:
    """A checked ``where``, ready to be rendered for a backend."""

    watch: str
    text: str
    columns: frozenset[str]  # declared columns it references
    _tree: exp.Expression = field(repr=False, compare=False)
    # What to_sql rendered, by dialect and alias: every evaluation of the watch asks again, and
    # rendering (sqlglot: copy, rewrite, generate) costs about a millisecond each time.
    _rendered: dict[tuple[str, str], str] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def to_sql(self, dialect: Literal["duckdb", "postgres"], *, alias: str = "c") -> str:
        """A boolean SQL expression over the change-log row `alias`, for that dialect."""
        if (done := self._rendered.get((dialect, alias))) is not None:
            return done
        if dialect not in ("duckdb", "postgres"):
            raise ValueError(f"unsupported dialect {dialect!r}")
        if not _ALIAS.match(alias):
            raise ValueError(f"alias {alias!r} is not a plain identifier")
        tree = _compile(self._tree.copy(), dialect, alias)
        rendered = self._rendered[(dialect, alias)] = tree.sql(dialect=dialect, comments=False)
        return rendered


def compile_filter(text: str, *, watch: str, columns: Mapping[str, str]) -> CompiledFilter:
    """Parse and check `text` against the source's declared columns (name -> changewatch type
    such as 'text', 'text[]'); raise FilterError.

    Pure: nothing touches a database.

    >>> f = compile_filter(
    ...     "changed(state) AND state = 'closed' AND 'bug' IN new.labels",
    ...     watch="closed_bugs",
    ...     columns={"number": "bigint", "state": "text", "labels": "text[]"},
    ... )
    >>> sorted(f.columns)
    ['labels', 'state']
    >>> print(f.to_sql("duckdb").replace(" AND ", "\\nAND "))
    (c."kind" <> 'update' OR COALESCE(LIST_CONTAINS(c."changed_columns", 'state'), FALSE))
    AND CASE WHEN c."kind" = 'delete' THEN c."old_state" ELSE c."new_state" END = 'closed'
    AND LIST_CONTAINS(c."new_labels", 'bug')
    >>> print(f.to_sql("postgres").split(" AND ")[0])
    (c."kind" <> 'update' OR COALESCE(('state' = ANY(c."changed_columns")), FALSE))
    >>> compile_filter("read_csv('/etc/passwd') IS NULL", watch="w", columns={})
    Traceback (most recent call last):
    ...
    changewatch.evaluators.filters.FilterError: watch 'w': where: function read_csv(...) ...
    """
    checked = _checked(text, tuple(columns.items()))
    if isinstance(checked, str):
        raise FilterError(watch, checked)
    tree, used = checked
    return CompiledFilter(watch=watch, text=text, columns=used, _tree=tree)


@functools.lru_cache(maxsize=1024)
def _checked(
    text: str, columns: tuple[tuple[str, str], ...]
) -> tuple[exp.Expression, frozenset[str]] | str:
    """The checked tree of ``text`` and the columns it uses, or why it is refused.

    Cached: sources of one shape share their watches' filters, and a thousand of them would
    each parse and check the same text in every run's process. The tree is never changed
    (``CompiledFilter.to_sql`` compiles a copy).
    """
    lookup = dict(columns)
    try:
        tree = _parse(text)
        used: set[str] = set()
        nodes = list(tree.walk())
        for node in nodes:
            _check(node, lookup, used)
        if not _is_condition(tree, lookup):
            raise _Refused(f"{_snippet(tree)} is not a condition: write e.g. state = 'closed'")
        for node in nodes:
            _check_operands(node, lookup)
        for dialect in ("duckdb", "postgres"):  # fails here, not at run time, if it cannot
            _compile(tree.copy(), dialect, "c").sql(dialect=dialect)
    except RecursionError:
        return str(_Refused("is nested too deeply"))
    except _Refused as error:
        return str(error)
    return tree, frozenset(used)


def _parse(text: str) -> exp.Expression:
    if not text.strip():
        raise _Refused("is empty: write a condition such as TRUE or state = 'closed'")
    if len(text) > MAX_LENGTH:
        raise _Refused(f"is longer than {MAX_LENGTH} characters")
    try:
        tokens = Dialect.get_or_raise(READ_DIALECT).tokenize(text)
    except SqlglotError as error:
        raise _Refused(f"cannot parse: {error}") from None
    if not tokens or any(token.comments for token in tokens):
        raise _Refused("comments (-- or /* */) are not allowed")
    if any(token.token_type == sqlglot.TokenType.SEMICOLON for token in tokens):
        raise _Refused("more than one statement (';' is not allowed)")
    try:
        statements = sqlglot.parse(text, read=READ_DIALECT)
    except SqlglotError as error:
        first = error.errors[0] if isinstance(error, ParseError) and error.errors else {}
        where = f" at column {first.get('col')} near {first.get('highlight')!r}" if first else ""
        detail = _parse_problem(first.get("description") or str(error))
        raise _Refused(f"cannot parse: {detail}{where}") from None
    if len(statements) != 1 or statements[0] is None:
        raise _Refused("more than one statement")
    tree = statements[0]
    if isinstance(tree, STATEMENTS):
        word = tree.name if isinstance(tree, exp.Command) else type(tree).__name__
        raise _Refused(f"a statement ({word.upper()} ...) is not allowed: write only a condition")
    return tree


# sqlglot's node classes, as a filter's writer knows them.
_OPERATORS = {
    "And": "AND", "Or": "OR", "Not": "NOT", "EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=",
    "LT": "<", "LTE": "<=", "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%",
    "Is": "IS", "In": "IN", "Like": "LIKE", "ILike": "ILIKE", "Between": "BETWEEN",
    "Cast": "CAST", "Paren": "(...)", "DPipe": "||",
}  # fmt: skip
_PARTS = {
    "this": "has nothing on its left side",
    "expression": "has nothing on its right side",
    "low": "lacks its lower bound",
    "high": "lacks its upper bound",
}
_MISSING = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")
_CLASS = re.compile(r"<class '[\w.]*?(\w+)'>")


def _parse_problem(description: str) -> str:
    """sqlglot's account of a parse error, in the words of the filter, not of its classes.

    >>> _parse_problem("Required keyword: 'expression' missing for <class 'x.core.And'>")
    'AND has nothing on its right side'
    >>> _parse_problem("Required keyword: 'this' missing for <class 'x.core.Not'>")
    'NOT has nothing to apply to'
    >>> _parse_problem("Required keyword: 'high' missing for <class 'x.core.Between'>")
    'BETWEEN lacks its upper bound'
    """
    missing = _MISSING.fullmatch(description.strip())
    if missing:
        part, kind = missing.groups()
        operator = _OPERATORS.get(kind, kind.upper())
        if kind == "Not" or (kind == "Paren" and part == "this"):
            return f"{operator} has nothing to apply to"
        if part in _PARTS:
            return f"{operator} {_PARTS[part]}"
        return f"{operator} lacks its {part!r}"
    return _CLASS.sub(lambda m: _OPERATORS.get(m[1], m[1].upper()), description)


def _check(node: exp.Expression, columns: Mapping[str, str], used: set[str]) -> None:
    """Refuse `node` unless its type is allowed where it stands; note the columns it uses."""
    kind = type(node)
    if kind not in ALLOWED_NODES:
        raise _Refused(f"{_describe(node)} is not allowed")
    if kind in ONLY_UNDER and not isinstance(node.parent, ONLY_UNDER[kind]):
        raise _Refused(f"{_snippet(node)} is not allowed here")
    if kind is exp.Column:
        qualifier, name, _ = _reference(node, columns)
        if name in columns and (qualifier or name not in CHANGE_FIELDS):
            used.add(name)
    elif kind is exp.Anonymous:
        _check_own_function(node, columns)
    elif kind is exp.In and node.args.get("field") is not None:
        _array_reference(node.args["field"], columns, f"IN {_snippet(node.args['field'])}")
    elif kind is exp.In:
        for item in node.expressions:
            if _is_array(item, columns):
                raise _Refused(
                    f"IN ({_snippet(item)}): to test whether an array contains a value, "
                    f"write 'value' IN {_snippet(item)} without parentheses"
                )
    elif kind is exp.DataType:
        if node.this not in CAST_TYPES or node.expressions:
            raise _Refused(f"cast to {node.sql(READ_DIALECT)} is not allowed")
    elif kind is exp.Interval:
        if not (isinstance(node.this, exp.Literal) and node.this.is_string):
            raise _Refused(f"{_snippet(node)}: an interval is written INTERVAL '1 day'")


def _check_operands(node: exp.Expression, columns: Mapping[str, str]) -> None:
    """Refuse AND, OR, NOT and CASE WHEN applied to something that is not a condition."""
    if isinstance(node, exp.And | exp.Or | exp.Not):
        for operand in (node.this, node.args.get("expression")):
            if operand is not None and not _is_condition(operand, columns):
                word = type(node).__name__.upper()
                raise _Refused(f"{word} needs conditions, but {_snippet(operand)} is not one")
    elif isinstance(node, exp.If) and node.parent.this is None:
        if not _is_condition(node.this, columns):
            raise _Refused(f"CASE WHEN {_snippet(node.this)}: not a condition")


def _reference(node: exp.Column, columns: Mapping[str, str]) -> tuple[str | None, str, str]:
    """(qualifier or None, name, changewatch type) of a column reference, or refuse it."""
    if not isinstance(node.this, exp.Identifier):
        raise _Refused("'*' is not allowed")
    known = ", ".join([*CHANGE_FIELDS, *columns])
    if node.args.get("db") or node.args.get("catalog"):
        raise _Refused(f"unknown qualifier in {_snippet(node)} (use old.<column> or new.<column>)")
    name = _name(node.this)
    table = node.args.get("table")
    if table is None:
        if name in CHANGE_FIELDS:
            return None, name, CHANGE_FIELDS[name]
        if name in columns:
            return None, name, columns[name]
        raise _Refused(f"unknown column {name!r} (known: {known})")
    qualifier = _name(table)
    if qualifier not in QUALIFIERS:
        raise _Refused(
            f"unknown qualifier {qualifier!r} in {_snippet(node)} "
            "(use old.<column> or new.<column>)"
        )
    if name not in columns:
        raise _Refused(f"unknown column {name!r} in {_snippet(node)} (known: {', '.join(columns)})")
    return qualifier, name, columns[name]


def _check_own_function(node: exp.Anonymous, columns: Mapping[str, str]) -> None:
    name = node.name.lower()
    if name not in OWN_FUNCTIONS:
        raise _Refused(f"function {node.name}(...) is not allowed")
    args = node.expressions
    if len(args) != 1 or not isinstance(args[0], exp.Column):
        raise _Refused(f"{name}() takes one column name, e.g. {name}(labels)")
    if name == "changed":
        qualifier, column, _ = _reference(args[0], columns)
        if qualifier is not None or column not in columns:
            raise _Refused(f"changed() takes a declared column's name, not {_snippet(args[0])}")
    else:
        _array_reference(args[0], columns, f"{name}({_snippet(args[0])})")


def _array_reference(node: exp.Expression, columns: Mapping[str, str], where: str) -> None:
    if not isinstance(node, exp.Column):
        raise _Refused(f"{where}: expected an array column such as labels or new.labels")
    if not _reference(node, columns)[2].endswith("[]"):
        raise _Refused(f"{where}: {_snippet(node)} is not an array column")


def _is_array(node: exp.Expression, columns: Mapping[str, str]) -> bool:
    return isinstance(node, exp.Column) and _reference(node, columns)[2].endswith("[]")


def _is_condition(node: exp.Expression, columns: Mapping[str, str]) -> bool:
    """Whether `node` is TRUE/FALSE/NULL-valued (a shallow check: no full type inference)."""
    if isinstance(node, exp.Paren):
        return _is_condition(node.this, columns)
    if type(node) in CONDITIONS:
        return True
    if isinstance(node, exp.Anonymous):
        return node.name.lower() == "changed"
    if isinstance(node, exp.Column):
        return _reference(node, columns)[2] == "boolean"
    if isinstance(node, exp.Cast):
        return node.to.this == _T.BOOLEAN
    if isinstance(node, exp.Case):
        results = [branch.args.get("true") for branch in node.args.get("ifs", [])]
        results.append(node.args.get("default") or exp.Null())
        return all(_is_condition(result, columns) for result in results)
    if isinstance(node, exp.Coalesce | exp.Nullif | exp.Greatest | exp.Least):
        return _is_condition(node.this, columns)
    return False


def _name(identifier: exp.Expression) -> str:
    # PostgreSQL folds unquoted names to lowercase.
    return identifier.name if identifier.args.get("quoted") else identifier.name.lower()


def _snippet(node: exp.Expression) -> str:
    try:
        text = node.sql(dialect=READ_DIALECT, comments=False)
    except SqlglotError:
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(node: exp.Expression) -> str:
    if isinstance(node, exp.Subquery | exp.Exists | exp.Query):
        return "a subquery"
    if isinstance(node, exp.Window):
        return "a window function (OVER ...)"
    if isinstance(node, exp.Placeholder):
        shown = "?" if node.args.get("jdbc") or not node.name else f":{node.name}"
        return f"a parameter placeholder ({shown})"
    if isinstance(node, exp.Parameter):
        return f"a parameter placeholder ({_snippet(node)})"
    if isinstance(node, exp.Star):
        return "'*'"
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}(...)"
    # Name a known function as PostgreSQL spells it (sqlglot renames some: string_agg...).
    call = _CALL.match(_snippet(node))
    if isinstance(node, exp.Func) and call:
        return f"function {call.group(1).lower()}(...)"
    if isinstance(node, STATEMENTS):
        return f"a statement ({_snippet(node)})"
    return f"{_snippet(node)} ({type(node).__name__})"


# --- compiling a checked tree for a backend ---------------------------------------------------


def _compile(node: exp.Expression, dialect: str, alias: str) -> exp.Expression:
    """Rewrite a checked tree, bottom up, into SQL over the change-log row `alias`."""

    def col(name: str) -> exp.Column:
        return exp.Column(this=exp.to_identifier(name, quoted=True), table=exp.to_identifier(alias))

    if isinstance(node, exp.Anonymous) and node.name.lower() == "changed":
        column = exp.Literal.string(_name(node.expressions[0].this))
        listed = _contains(col("changed_columns"), column, dialect)
        not_update = exp.NEQ(this=col("kind"), expression=exp.Literal.string("update"))
        return exp.paren(exp.or_(not_update, exp.func("COALESCE", listed, exp.false())))
    if isinstance(node, exp.Column):
        name = _name(node.this)
        if node.args.get("table") is not None:
            return col(f"{_name(node.args['table'])}_{name}")
        if name in CHANGE_FIELDS:
            return col(name)
        is_delete = exp.EQ(this=col("kind"), expression=exp.Literal.string("delete"))
        return exp.Case(
            ifs=[exp.If(this=is_delete, true=col(f"old_{name}"))], default=col(f"new_{name}")
        )
    for child in list(node.iter_expressions()):
        compiled = _compile(child, dialect, alias)
        if compiled is not child:
            child.replace(compiled)
    if isinstance(node, exp.In) and node.args.get("field") is not None:
        return _contains(node.args["field"], node.this, dialect)
    if isinstance(node, exp.Anonymous):  # cardinality
        name = "LEN" if dialect == "duckdb" else "CARDINALITY"
        return exp.Anonymous(this=name, expressions=node.expressions)
    if dialect == "postgres" and isinstance(node, exp.Div):
        # PostgreSQL divides integers as integers; DuckDB does not. Make both divide reals.
        node.set("expression", exp.cast(node.expression, "DOUBLE PRECISION"))
    if dialect == "postgres" and isinstance(node, exp.Round):
        # round(double precision) rounds halves to even on PostgreSQL, and round(double, n)
        # does not exist: round numerics there (halves away from zero, as DuckDB does).
        node.set("this", exp.cast(node.this, "NUMERIC"))
    return node


def _contains(array: exp.Expression, value: exp.Expression, dialect: str) -> exp.Expression:
    if dialect == "duckdb":
        return exp.Anonymous(this="LIST_CONTAINS", expressions=[array, value])
    return exp.paren(exp.EQ(this=value, expression=exp.Any(this=exp.paren(array))))


def check_filter_runs(
    compiled: CompiledFilter,
    columns: Mapping[str, str],
    connection: duckdb.DuckDBPyConnection | None = None,
) -> None:
    """Bind the filter against an empty change log in an in-memory DuckDB; raise FilterError.

    ``compile_filter`` admits only safe shapes, but a safe shape can still be ill-typed
    (``kind = 1``, ``lower(number)``): this catches that at config load, where the error names
    the watch, instead of on every evaluation run. Checking many filters, pass one in-memory
    ``connection`` for all (opening one costs some 15 ms, a thousand watches 15 s): each set
    of columns gets its empty table there once.

    >>> f = compile_filter("lower(number) = 'x'", watch="w", columns={"number": "bigint"})
    >>> check_filter_runs(f, {"number": "bigint"})
    Traceback (most recent call last):
    ...
    changewatch.evaluators.filters.FilterError: watch 'w': where: does not run: ...
    """
    import duckdb

    sql = compiled.to_sql("duckdb")
    ran = (tuple(sorted(columns.items())), sql)
    if ran in _RAN:
        return
    if connection is None:
        with duckdb.connect() as con:
            return check_filter_runs(compiled, columns, con)
    table = _empty_change_log(connection, columns)
    try:
        connection.execute(f"SELECT count(*) FROM {table} AS c WHERE {sql}")
    except duckdb.Error as error:
        reason = str(error).splitlines()[0]
        raise FilterError(compiled.watch, f"does not run: {reason}") from None
    if len(_RAN) >= _RAN_KEPT:  # a long-lived process reloading configs keeps a bounded set
        _RAN.clear()
    _RAN.add(ran)


# (columns, SQL) pairs that bound in this process. A thousand sources of one shape give their
# watches the same filter text over the same columns: it binds the same way every time, and
# binding it again cost each sync run a second at start (loading the config).
_RAN: set[tuple[tuple[tuple[str, str], ...], str]] = set()
_RAN_KEPT = 4096


def _empty_change_log(con: duckdb.DuckDBPyConnection, columns: Mapping[str, str]) -> str:
    """The name of an empty change log of ``columns`` on ``con``, made the first time."""
    from changewatch.warehouse.schema import SQL_TYPES

    signature = json.dumps(sorted(columns.items())).encode()
    table = "changes_" + hashlib.sha256(signature).hexdigest()[:16]
    values = ", ".join(
        f'"{prefix}{name}" {SQL_TYPES[kind]}'
        for name, kind in columns.items()
        for prefix in ("old_", "new_")
    )
    statement = (
        f"CREATE TEMP TABLE IF NOT EXISTS {table} (change_id BIGINT, kind TEXT, "
        "object_key TEXT, changed_columns TEXT[], detected_at TIMESTAMPTZ"
        + (f", {values}" if values else "")
        + ")"
    )
    con.execute(statement.replace("DOUBLE PRECISION", "DOUBLE"))
    return table
