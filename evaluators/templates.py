"""Checks of a watch's notification templates (title, body, url) against what they can name.

A notification is rendered with these names (see ``evaluate._context``); ``old``, ``new`` and
``current`` map each column of the change's source to its value. Jinja renders a misspelt name
as an empty string, so a typo would only show in the notifications themselves: the check finds
it when the config loads.
"""

from __future__ import annotations

from collections.abc import Collection

from jinja2 import meta, nodes
from jinja2.sandbox import SandboxedEnvironment

__all__ = ["TEMPLATE_NAMES", "template_problems"]

TEMPLATE_NAMES = frozenset(
    {
        "watch",
        "source",
        "kind",
        "key",
        "change_id",
        "old",
        "new",
        "current",
        "changed",
        "summary",
        "urgency",
        "reasoning",
    }
)
# Names whose attributes are the source's columns.
_ROWS = ("old", "new", "current")


def template_problems(template: str, source: str, columns: Collection[str]) -> list[str]:
    """What ``template`` names that a notification of ``source`` (with ``columns``) lacks.

    >>> template_problems("#{{ key }} {{ new.titel }} {{ kind | upper }}", "s", ["title"])
    ["'new.titel' (template line 1): source 's' has no column 'titel'"]
    >>> template_problems("{{ summry }}{% for c in changed %}{{ c }}{% endfor %}", "s", [])
    ... # doctest: +ELLIPSIS
    ["'summry' (template line 1): unknown name; known: change_id, changed, ..., watch"]
    """
    tree = SandboxedEnvironment().parse(template)
    problems = []
    for name in sorted(meta.find_undeclared_variables(tree) - TEMPLATE_NAMES):
        node = next(n for n in tree.find_all(nodes.Name) if n.name == name)
        known = ", ".join(sorted(TEMPLATE_NAMES))
        problems.append(f"{name!r} (template line {node.lineno}): unknown name; known: {known}")
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        target = node.node
        if not (isinstance(target, nodes.Name) and target.name in _ROWS):
            continue
        if isinstance(node, nodes.Getattr):
            column = node.attr
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            column = node.arg.value
        else:
            continue  # a computed key: only the rendering knows
        if column not in columns and not hasattr(dict, column):  # `new.items()` is fine
            problems.append(
                f"'{target.name}.{column}' (template line {node.lineno}): source {source!r} has "
                f"no column {column!r}"
            )
    return problems
