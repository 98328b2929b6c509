"""`changewatch sql`'s guard: admit one read of the warehouse's tables, refuse anything else.

Where it sits: the ``sql`` command parses the user's statement, this module checks the parsed
tree and renders the SQL that runs (never the text as typed, so what the database sees is what
was checked). The database's own settings (a read-only, sandboxed connection and a statement
timeout) are the second line; this check is the first, and on PostgreSQL, where the URL's user
may be a superuser, the one that keeps server files and other sessions out of reach.

Admitted: one query (SELECT, WITH [RECURSIVE], UNION/INTERSECT/EXCEPT, VALUES) whose every
node is of an allowed kind (joins, subqueries, GROUP BY, window functions, FILTER, ORDER BY,
LIMIT...), whose functions are in ``FUNCTIONS`` or ``NAMED_FUNCTIONS``, and whose tables are the
warehouse's own (its schema only) or CTEs in scope; ``unnest``, ``generate_series`` and
``range`` may stand in FROM. Refused: every other statement (COPY, EXPORT, ATTACH, SET, PRAGMA,
INSTALL, LOAD, CALL, CHECKPOINT, DDL, DML), other table functions (read_csv, glob, pg_ls_dir),
unknown functions (read_text, pg_read_file, pg_terminate_backend, current_setting), system
catalogs (pg_catalog, information_schema, duckdb_*), other schemas and attached databases,
SELECT INTO, FOR UPDATE and parameters, a query nested too deeply to parse, and calls that
would build a value past ``sql_bounds.MAX_BUILT`` (see there). Every warehouse table is
rendered qualified by its schema, so no search path can turn a name into a system table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import sqlglot
from changewatch.warehouse.sql_bounds import bound_builders
from changewatch.warehouse.sql_functions import FUNCTIONS as FILTER_FUNCTIONS
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

__all__ = ["FUNCTIONS", "NAMED_FUNCTIONS", "QueryRefused", "QueryUnreadable", "read_guard"]


def _types(names: str) -> frozenset[type[exp.Expression]]:
    # By name, skipping any this sqlglot version lacks: the set only ever shrinks that way.
    return frozenset(getattr(exp, name) for name in names.split() if hasattr(exp, name))


# Functions sqlglot parses into their own node types (aggregates, window, scalar).
FUNCTIONS = _types(
    """
        Count CountIf Sum Avg Min Max ArrayAgg ArrayUniqueAgg GroupConcat Stddev StddevPop
        StddevSamp Variance VariancePop Median Quantile PercentileCont PercentileDisc
        ApproxDistinct AnyValue First Last ArgMax ArgMin LogicalAnd LogicalOr Mode Corr
        CovarPop CovarSamp JSONArrayAgg JSONBObjectAgg JSONObjectAgg
        RowNumber Rank DenseRank PercentRank CumeDist Ntile Lag Lead FirstValue LastValue NthValue
        Lower Upper Length Trim Substring Concat ConcatWs Replace RegexpLike RegexpILike
        RegexpExtract RegexpExtractAll RegexpReplace RegexpSplit Split SplitPart StartsWith
        EndsWith Left Right Pad Repeat Reverse StrPosition Initcap MD5 SHA SHA2 Levenshtein
        Contains Ascii Chr Unicode Translate Overlay Format BitLength Hex Encode Decode Typeof
        Abs Round Ceil Floor Sqrt Ln Log Exp Pow Sign Trunc WidthBucket Rand Uuid
        Coalesce Nullif Greatest Least If Case Cast TryCast Exists
        CurrentDate CurrentTime CurrentTimestamp Extract DateTrunc TimestampTrunc DateAdd DateSub
        DateDiff TimestampAdd TimestampSub TimestampDiff DateBin DateFromParts TimeToStr StrToTime
        StrToDate TimeToUnix UnixToTime TsOrDsToDate Year Quarter Month Week WeekOfYear Day
        DayOfWeek DayOfWeekIso DayOfMonth DayOfYear MakeInterval JustifyDays JustifyHours
        JustifyInterval ToDays
        Array ArraySize ArrayContains ArrayContainsAll ArrayOverlaps ArrayConcat ArraySort
        ArrayDistinct ArrayFilter ArrayPosition ArrayToString ArrayAppend ArrayPrepend ArrayRemove
        ArraySlice ArrayFirst ArrayLast ArrayReverse StringToArray Transform Explode Unnest
        GenerateSeries ExplodingGenerateSeries Struct StructExtract
        JSONExtract JSONExtractScalar JSONBExtract JSONBExtractScalar JSONBContains
        JSONBContainsTopKey JSONFormat ParseJSON JSONKeys JSONArrayLength JSONObject
        """
) | frozenset(FILTER_FUNCTIONS)
# Functions sqlglot leaves anonymous, admitted by name: each computes from its arguments only.
NAMED_FUNCTIONS = frozenset(
    """
    age array_length array_lower array_upper array_dims array_ndims array_fill cardinality
    btrim ltrim rtrim octet_length char_length character_length strpos quote_ident quote_literal
    printf base64 to_base64 from_base64 hash now clock_timestamp statement_timestamp century
    date_part datepart epoch epoch_ms make_date make_time make_timestamp make_timestamptz
    time_bucket isodow isoyear yearweek dayname monthname last_day
    list_slice list_extract list_element list_aggregate list_has_all list_has_any list_reverse
    list_value list_zip list_min list_max list_sum list_avg list_count list_unique
    array_to_json to_json to_jsonb row_to_json json_build_object jsonb_build_object
    json_build_array jsonb_build_array json_object_keys jsonb_object_keys jsonb_agg json_agg
    json_array_length jsonb_array_length json_typeof jsonb_typeof json_extract_path_text
    jsonb_extract_path_text json_extract_path jsonb_extract_path json_array_elements
    jsonb_array_elements json_array_elements_text jsonb_array_elements_text jsonb_path_query
    jsonb_path_exists jsonb_strip_nulls jsonb_pretty json_extract_string json_value
    json_exists json_contains json_type json_valid json_structure json_transform
    regexp_match regexp_matches regexp_full_match regexp_count regexp_split_to_array
    string_split string_split_regex str_split suffix prefix jaccard jaro_winkler_similarity
    every num_nulls num_nonnulls pg_typeof isfinite isnan isinf gcd lcm factorial
    bool_and bool_or bit_count to_hex sha256 sha1 ceiling
    """.split()
)
# Node types other than functions a query may hold (exact types): deny by default.
NODES = _types(
    """
    Select Union Intersect Except Subquery With CTE TableAlias Alias Table From Join Where
    Group Having Qualify Order Ordered Limit Offset Fetch Distinct Window WindowSpec Lateral
    Values Tuple Cube Rollup GroupingSets TableSample
    Column Star Identifier Literal Null Boolean Paren Bracket Dot Slice Interval Var DataType
    DataTypeParam Lambda Kwarg PropertyEQ Filter WithinGroup IgnoreNulls RespectNulls
    Any All Exists In Between Like ILike SimilarTo Glob Is Not And Or Xor EQ NEQ GT GTE LT LTE
    NullSafeEQ NullSafeNEQ Add Sub Mul Div IntDiv Mod Neg DPipe BitwiseAnd BitwiseOr BitwiseXor
    BitwiseNot BitwiseLeftShift BitwiseRightShift Escape AtTimeZone HexString ByteString
    BitString RawString UnicodeString Collate JSONPath JSONPathKey JSONPathRoot JSONPathSubscript
    JSONPathWildcard
    JSONPathSlice
    """
)
# Types sqlglot does not know, admitted by name (others may be types of an extension).
USER_TYPES = frozenset({"void"})
# What may stand in FROM in place of a table: functions of their arguments only.
FROM_FUNCTIONS = _types("Unnest Explode GenerateSeries ExplodingGenerateSeries")
QUERIES = _types("Select Union Intersect Except Subquery Values")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(")


class QueryRefused(ValueError):
    """The statement is not a read of the warehouse's tables; the message names the part."""


class QueryUnreadable(QueryRefused):
    """The statement does not parse; the message says where."""


def read_guard(text: str, *, dialect: str, tables: Mapping[str, str], schema: Sequence[str]) -> str:
    """The SQL to run for ``text``, one statement in ``dialect``; else ``QueryRefused``.

    ``tables``: the warehouse's tables, by lowercase name; ``schema``: the qualifier that
    reaches them (``[schema]`` or ``[catalog, schema]``). Pure: nothing touches a database.

    >>> read_guard("SELECT state, count(*) FROM issues GROUP BY 1", dialect="postgres",
    ...            tables={"issues": "issues"}, schema=["cw"])
    'SELECT state, COUNT(*) FROM "cw"."issues" GROUP BY 1'
    >>> read_guard("SELECT pg_read_file('/etc/passwd')", dialect="postgres", tables={},
    ...            schema=["cw"])
    Traceback (most recent call last):
    ...
    changewatch.warehouse.read_guard.QueryRefused: function pg_read_file is not allowed ...
    >>> read_guard("SELECT * FROM pg_authid", dialect="postgres", tables={"issues": "issues"},
    ...            schema=["cw"])
    Traceback (most recent call last):
    ...
    changewatch.warehouse.read_guard.QueryRefused: table pg_authid is not a warehouse table ...
    """
    # sqlglot parses and renders by recursion: a deep nesting of parentheses or calls would
    # end in Python's RecursionError, so it is refused as the filter checker refuses it.
    try:
        tree = _parse(text, dialect)
        if type(tree) not in QUERIES:
            word = text.split(maxsplit=1)[0].upper()
            raise QueryRefused(
                f"{word} is not allowed: changewatch sql runs only a read (SELECT, WITH or VALUES)"
            )
        for node in list(tree.walk()):
            _check(node, dialect, tables, schema)
        if (problem := bound_builders(tree, dialect)) is not None:
            raise QueryRefused(problem)
        return tree.sql(dialect=dialect, comments=False)
    except RecursionError:
        raise QueryRefused("the query is nested too deeply") from None


def _parse(text: str, dialect: str) -> exp.Expression:
    try:
        statements = sqlglot.parse(text, read=dialect)
    except SqlglotError as error:
        first = error.errors[0] if isinstance(error, ParseError) and error.errors else {}
        where = (
            f" at line {first.get('line')}, column {first.get('col')} near "
            f"{first.get('highlight')!r}"
            if first
            else ""
        )
        detail = first.get("description", str(error).splitlines()[0] if str(error) else "")
        raise QueryUnreadable(f"cannot parse the query: {detail}{where}") from None
    if len(statements) != 1 or statements[0] is None:
        raise QueryRefused("give exactly one statement")
    return statements[0]


def _check(
    node: exp.Expression, dialect: str, tables: Mapping[str, str], schema: Sequence[str]
) -> None:
    kind = type(node)
    if kind is exp.Anonymous:
        if node.name.lower() not in NAMED_FUNCTIONS:
            raise QueryRefused(_not_allowed(f"function {node.name.lower()}"))
    elif kind not in NODES and kind not in FUNCTIONS:
        shown = _function(node, dialect) if isinstance(node, exp.Func) else None
        raise QueryRefused(_not_allowed(shown or _describe(node, dialect)))
    if kind is exp.Dot and isinstance(node.expression, exp.Func):
        # schema.function(...): a function of another schema, whatever its name.
        raise QueryRefused(_not_allowed(f"the schema-qualified function {_snippet(node, dialect)}"))
    if kind is exp.Select and (node.args.get("into") or node.args.get("locks")):
        raise QueryRefused(_not_allowed("SELECT INTO or FOR UPDATE/SHARE"))
    if kind is exp.DataType and node.this == exp.DataType.Type.USERDEFINED:
        if node.sql(dialect).lower() not in USER_TYPES:
            raise QueryRefused(_not_allowed(f"type {node.sql(dialect)}"))
    if kind is exp.Table:
        _check_table(node, dialect, tables, schema)


def _check_table(
    node: exp.Table, dialect: str, tables: Mapping[str, str], schema: Sequence[str]
) -> None:
    """Admit a CTE in scope or a warehouse table (rendered qualified); refuse anything else."""
    if not isinstance(node.this, exp.Identifier):
        if type(node.this) in FROM_FUNCTIONS:
            return
        if node.this is None:
            raise QueryRefused(_not_allowed(_describe(node, dialect)))
        shown = _function(node.this, dialect) or _describe(node.this, dialect)
        raise QueryRefused(_not_allowed(f"table {shown}"))
    name = _name(node.this)
    qualifiers = [_name(part) for part in node.parts[:-1]]
    if not qualifiers and _cte_in_scope(node, name):
        return
    known = ", ".join(sorted(tables)) or "none yet"
    shown = ".".join([*qualifiers, name])
    if (
        qualifiers
        and [q.lower() for q in qualifiers] != [s.lower() for s in schema][-len(qualifiers) :]
    ):
        raise QueryRefused(
            f"table {shown} is outside the warehouse: only its own tables may be read "
            f"(tables: {known})"
        )
    if name.lower() not in tables:
        raise QueryRefused(f"table {shown} is not a warehouse table (tables: {known})")
    node.set("this", exp.to_identifier(tables[name.lower()], quoted=True))
    node.set("db", exp.to_identifier(schema[-1], quoted=True))
    node.set("catalog", exp.to_identifier(schema[0], quoted=True) if len(schema) > 1 else None)


def _cte_in_scope(table: exp.Table, name: str) -> bool:
    """Whether ``name`` in ``table`` names a CTE the database would resolve it to.

    In a WITH without RECURSIVE a CTE sees only the ones before it; a name it uses of its own
    or a later one is a real table, so it is checked as one.
    """
    child, node = table, table.parent
    while node is not None:
        if isinstance(node, exp.With):
            names = [_name(cte.args["alias"].this) for cte in node.expressions]
            at = next(i for i, cte in enumerate(node.expressions) if cte is child)
            if name in (names if node.args.get("recursive") else names[:at]):
                return True
        else:
            with_ = node.args.get("with_") or node.args.get("with")
            if isinstance(with_, exp.With) and with_ is not child:
                if name in (_name(cte.args["alias"].this) for cte in with_.expressions):
                    return True
        child, node = node, node.parent
    return False


def _name(identifier: exp.Expression) -> str:
    # Both databases fold unquoted names (PostgreSQL to lowercase; DuckDB ignores case).
    return identifier.name if identifier.args.get("quoted") else identifier.name.lower()


def _not_allowed(what: str) -> str:
    return f"{what} is not allowed in changewatch sql (see the README: Query the tables with SQL)"


def _function(node: exp.Expression, dialect: str) -> str | None:
    """``function <name>`` as the user wrote it, or None if it is not written as a call."""
    if isinstance(node, exp.Anonymous):
        return f"function {node.name.lower()}"
    call = _CALL.match(_snippet(node, dialect))
    return f"function {call.group(1).lower()}" if call else None


def _describe(node: exp.Expression, dialect: str) -> str:
    if isinstance(node, exp.Placeholder | exp.Parameter):
        return f"a parameter ({_snippet(node, dialect)})"
    return f"{_snippet(node, dialect)} ({type(node).__name__})"


def _snippet(node: exp.Expression, dialect: str) -> str:
    try:
        text = node.sql(dialect=dialect, comments=False)
    except SqlglotError:
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
