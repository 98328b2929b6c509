"""The labelled set in evals/: its shape, so scores measured on it mean what they say."""

from __future__ import annotations

from collections import Counter

import pytest
from changewatch.evaluators.evals import load_examples_file
from cw_testing import REPO

FILES = sorted((REPO / "evals").glob("*.yaml"))


def test_the_set_is_large_and_covers_four_conditions() -> None:
    sets = [load_examples_file(path) for path in FILES]
    assert len(sets) >= 4
    assert sum(len(s.examples) for s in sets) >= 150
    # Each file says what its labels were given against, as the judge's prompt would.
    conditions = [s.condition for s in sets]
    assert all(c and len(c) > 80 for c in conditions), conditions
    assert len(set(conditions)) == len(conditions)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_condition_is_balanced_labelled_and_split(path) -> None:
    examples = load_examples_file(path).examples
    labels = Counter(e.expect for e in examples)
    assert abs(labels["notify"] - labels["skip"]) <= len(examples) // 10, labels
    names = [e.name for e in examples]
    assert all(names) and len(set(names)) == len(names)
    missing = [e.name for e in examples if not (e.reason and e.reason.strip())]
    assert missing == []
    assert all(len(e.reason.splitlines()) == 1 for e in examples)  # type: ignore[union-attr]
    # About a third to tune a prompt on, the rest held out; both labels in each part.
    tune = [e for e in examples if e.split == "tune"]
    assert all(e.split in ("tune", "test") for e in examples)
    assert 0.25 <= len(tune) / len(examples) <= 0.4
    assert {e.expect for e in tune} == {"notify", "skip"}
    for example in examples:
        change = example.change("w")
        assert change.source != "eval"  # each file names its source
        if example.kind == "update":
            assert change.changed_columns, example.name  # an update changes something
        else:
            assert (change.old is None) == (example.kind == "insert"), example.name
