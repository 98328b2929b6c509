"""The SQL functions both checked languages share: a watch's filters and `changewatch sql`.

The filter checker (evaluators/filters.py) admits exactly these; the read guard
(warehouse/read_guard.py) starts from them and adds its own. They live here, under both, so
the warehouse does not reach up into the evaluators for them.
"""

from __future__ import annotations

from sqlglot import exp

__all__ = ["FUNCTIONS"]

# Functions that sqlglot parses into their own node types, by the name a user writes.
FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Lower: "lower",
    exp.Upper: "upper",
    exp.Length: "length",
    exp.Trim: "trim",
    exp.Coalesce: "coalesce",
    exp.Nullif: "nullif",
    exp.Abs: "abs",
    exp.Round: "round",
    exp.Greatest: "greatest",
    exp.Least: "least",
    exp.CurrentTimestamp: "now",
}
