"""The fields family (evaluators/learned_structure.py) reads what the embedding of the prompt
cannot: the direction of a status's transition, with the real embedding model beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from changewatch.evaluators import learned
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import render_user_prompt
from changewatch.evaluators.learned_structure import delta_text, field_tokens

CONDITION = "A provider's incident is back: its status page reports the problem again."
PROVIDERS = ("PayCo", "CardHub", "CloudCo", "Textly", "MailerAPI", "ShipIt", "Ledgerly")


def _examples(start: int, stop: int) -> list[EvalExample]:
    """Status-page updates whose status flips one way (resolved -> investigating: the incident
    is back, notify) or the other (investigating -> resolved, skip): the two prompts hold the
    same words, only which side each stands on differs."""
    examples = []
    for i in range(start, stop):
        back = i % 2 == 0
        before, after = ("resolved", "investigating") if back else ("investigating", "resolved")
        row = {
            "provider": PROVIDERS[i % len(PROVIDERS)],
            "name": f"{PROVIDERS[i % len(PROVIDERS)]} API errors in region {i % 5}",
            "impact": ("minor", "major")[i // 2 % 2],
        }
        examples.append(
            EvalExample(
                key=f"incident-{i}",
                source="provider_status",
                old=row | {"status": before},
                new=row | {"status": after},
                expect="notify" if back else "skip",
            )
        )
    return examples


def _prompts(examples: list[EvalExample]) -> list[str]:
    return [render_user_prompt(e.change("status_pages")) for e in examples]


def _right(model: learned.LearnedModel, examples: list[EvalExample]) -> float:
    p = model.probabilities(_prompts(examples))
    return sum(
        bool(x >= 0.5) == (e.expect == "notify") for x, e in zip(p, examples, strict=True)
    ) / len(examples)


def test_the_fields_family_separates_a_transition_the_text_family_cannot() -> None:
    train, new = _examples(0, 30), _examples(30, 60)
    labels = [e.expect == "notify" for e in train]
    text = learned.fit(_prompts(train), labels, condition=CONDITION, families=("text",))
    chosen = learned.fit(_prompts(train), labels, condition=CONDITION)
    assert text is not None and chosen is not None
    # The embedding of "old: resolved, new: investigating" and of the reverse are alike: no
    # better than a coin on new changes, and it decides nothing.
    assert text.family == "text" and _right(text, new) <= 0.7 and text.threshold == 1.0
    # The inner cross-validation picks the fields, which name the transition: every new
    # change right, and sure enough to decide.
    assert chosen.family == "fields"
    assert _right(chosen, new) == 1.0 and chosen.threshold < 1.0


def test_the_tokens_and_new_text_of_a_change() -> None:
    [back] = _prompts(_examples(0, 1))
    assert "status:resolved>investigating" in field_tokens(back)
    assert "changed=status" in field_tokens(back)
    # An update's new text is what its changed columns became; n-grams of it do not say in
    # which direction a value moved, the fields do.
    assert delta_text(back) == "status: resolved > investigating"


def test_the_same_labels_make_the_same_model_in_any_process(tmp_path: Path) -> None:
    """The version (a hash of the pickled model, in verdicts and the verdict cache) does not
    depend on the process: the fields' and n-grams' vocabulary pickle in a fixed order, not in
    the order of a set that string hashing shuffles per process."""
    train = _examples(0, 30)
    labels = [e.expect == "notify" for e in train]
    model = learned.fit(_prompts(train), labels, condition=CONDITION, families=("fields",))
    assert model is not None and model.structure is not None
    assert model.structure.vectorizer is not None  # the n-grams are in the model too
    learned.save(model, tmp_path / "model.pkl")
    script = (
        "import sys; from pathlib import Path; from changewatch.evaluators import learned; "
        "print(learned.load(Path(sys.argv[1])).version)"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "model.pkl")],
            env=os.environ | {"PYTHONHASHSEED": seed}, capture_output=True, text=True,
            check=True,
        )
        assert done.stdout.strip() == model.version
