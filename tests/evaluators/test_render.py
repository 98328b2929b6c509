"""Templates rendered over many notifications at once give what one render each gives."""

from __future__ import annotations

from typing import Any

import pytest
from changewatch.evaluators.evaluate import _render, _render_all


def contexts(count: int) -> list[dict[str, Any]]:
    return [
        {
            "watch": "w",
            "source": "demo_issues",
            "kind": "update",
            "key": str(n),
            "change_id": n,
            "old": {"title": f"old {n}", "labels": ["bug"]},
            "new": {"title": f"new {n}", "labels": ["bug", "ui"], "comments": n},
            "current": {"title": f"new {n}", "html_url": f"https://x.test/{n}"},
            "changed": ["title", "labels"],
            "summary": "  padded  ",
            "urgency": "normal",
            "reasoning": "",
        }
        for n in range(count)
    ]


@pytest.mark.parametrize(
    "template",
    [
        "Closed #{{ key }}: {{ new.title }}",
        "{{ current.html_url or current.url or '' }}",
        "{{ summary }}",
        "no placeholders, spaces around   ",
        "{% for c in changed %}{{ loop.index }}={{ c }} {% endfor %}",
        "{% set n = new.comments * 2 %}{{ n }} {{ range(2) | list }}",
        "{{ new.labels | join(', ') }}{% if kind == 'update' %} (edit){% endif %}",
        # Names a single render would not know (loop outside a for, a typo): one by one.
        "{{ loop }}{{ key }}",
        "{{ titel }}!",
        # Output holding the separator's NUL bytes, and text that looks like template syntax.
        "{{ '\\x00' }}{{ key }}\\x00",
        "{{ '{% endfor %}' }}",
    ],
)
def test_rendering_all_at_once_equals_one_render_each(template: str) -> None:
    many = contexts(50)
    assert _render_all(template, many) == [_render(template, c) for c in many]


def test_nothing_to_render_renders_nothing() -> None:
    assert _render_all("{{ key }}", []) == []
