"""Features of a change's structure for the learned judge stage: what changed, not its prose.

Beside learned_features' embedding of the prompt text and its numeric diffs, two feature blocks
read the change as a record (issue 33, third round: on incident, status-page and release
watches, embeddings of forty changes did not separate them):

- **fields**: one-hot tokens of the change's shape: its kind (insert, update, delete), which
  columns changed, the new value of each short categorical column (a status, a severity, a
  label in a list, true/false/null) and, on updates, its old -> new transition and the items
  a list gained or lost; plus, per term of the watch's condition, whether the change's new
  text contains it (the words the condition and the change share: the condition says which
  words matter, the labels how much). Tokens seen in fewer than ``MIN_COUNT`` training
  changes are dropped (a tag name or an issue number is seen once and says nothing).
- **ngrams**: TF-IDF of character n-grams (3-5, within words) of the change's *new* text: on
  an insert every value, on an update what the changed columns gained (the transitions of
  short values and the words added to long ones), on a delete the old values. An alternative
  to the sentence embedding that reads words such as "CVE", "502" or "maintenance" as they are.

Both are fitted on the training changes (vocabulary, IDF) and kept with the model, so a
change's features depend only on the model and the change: deterministic, no network.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from changewatch.evaluators.learned_features import values_of

__all__ = ["MIN_COUNT", "Structure", "condition_terms", "delta_text", "field_tokens"]

# A string this short, of at most this many words, is a category (a status, a label, a
# region), not prose: its value is a token of its own.
_SHORT_CHARS = 32
_SHORT_WORDS = 3
# Tokens (and n-grams) seen in fewer training changes are not features.
MIN_COUNT = 2
# Condition words compared by their first letters ("failing", "failures", "fail"), a stemmer
# that needs no language data.
_STEM = 4
_WORD = re.compile(r"[^\W_]+")
# Words too common in conditions to say which changes meet them.
_STOP = frozenset(
    "about above after again also and any are because been before being both but can could "
    "does doing done down each else even ever from further had has have having here into its "
    "just like made make many more most much must new not now off once only other our out over "
    "own same should since some such than that the their them then there these they this those "
    "through too under until upon very was were what when where which while who whom why will "
    "with within without would you your".split()
)


def _stems(text: str) -> set[str]:
    """Stems of the words of ``text`` (4+ letters, not stop words).

    >>> sorted(_stems("Payments failing for the API; failures of payment"))
    ['fail', 'paym']
    """
    words = (w.lower() for w in _WORD.findall(text))
    return {w[:_STEM] for w in words if len(w) >= 4 and w not in _STOP and not w.isdigit()}


def condition_terms(condition: str | None) -> list[str]:
    """The stems of a condition's words, sorted: the terms a change may share with it.

    >>> condition_terms("An outage, or errors for many users.")
    ['erro', 'outa', 'user']
    """
    return sorted(_stems(condition or ""))


def _category(value: Any) -> str | None:
    """``value`` as a category token, or None when it is prose or a number.

    >>> [_category(v) for v in ("Investigating", None, True, 3, "a long sentence of words")]
    ['investigating', 'null', 'true', None, None]
    """
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, str) and len(value) <= _SHORT_CHARS and len(value.split()) <= _SHORT_WORDS:
        return value.strip().lower()
    return None


def _items(value: Any) -> set[str] | None:
    """The categories of a list of short values (labels, components), else None."""
    if not isinstance(value, list):
        return None
    items = {_category(item) for item in value}
    return None if None in items else {str(item) for item in items}


def _kind(prompt: str) -> str:
    for line in prompt.splitlines():
        if line.startswith("kind: "):
            return line[6:].strip()
    return "unknown"


def _sides(prompt: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The kind, and the values before and after (a delete's "after" is its old row)."""
    kind = _kind(prompt)
    old, new = values_of(prompt)
    if kind == "delete" and not new:
        new, old = old, {}
    return kind, old, new


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old and old.get(k) != new.get(k))


def field_tokens(prompt: str) -> list[str]:
    """The shape of the change in ``prompt`` as tokens (before any vocabulary).

    >>> field_tokens('kind: update\\nold values: {"s":"open","l":["a"]}\\n'
    ...              'new values: {"s":"closed","l":["a","b"]}')
    ['kind=update', 'changed=l', 'changed=s', 'l=a', 'l=b', 'l+=b', 's=closed', 's:open>closed']
    """
    kind, old, new = _sides(prompt)
    tokens = [f"kind={kind}"] + [f"changed={c}" for c in _changed(old, new)]
    for column in sorted(new):
        value, before = new[column], old.get(column)
        if (items := _items(value)) is not None:
            tokens += [f"{column}={item}" for item in sorted(items)]
            if old and (was := _items(before)) is not None:
                tokens += [f"{column}+={item}" for item in sorted(items - was)]
                tokens += [f"{column}-={item}" for item in sorted(was - items)]
        elif (category := _category(value)) is not None:
            tokens.append(f"{column}={category}")
            if old and before != value and (was_category := _category(before)) is not None:
                tokens.append(f"{column}:{was_category}>{category}")
    return sorted(set(tokens), key=tokens.index)


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [w for item in value for w in _words(item)]
    if isinstance(value, str):
        return value.split()
    return [] if value is None else [str(value).lower()]


def delta_text(prompt: str) -> str:
    """The change's new text: an insert's (a delete's) values; an update's changed columns,
    short values as ``old > new``, long ones by the words they gained.

    >>> delta_text('kind: update\\nold values: {"b":"It is slow.","s":"open"}\\n'
    ...            'new values: {"b":"It is slow. Now down for all.","s":"open"}')
    'b: Now down for all.'
    >>> delta_text('kind: insert\\nold values: (none)\\nnew values: {"t":"Outage","n":3}')
    'n: 3 t: Outage'
    """
    _, old, new = _sides(prompt)
    parts = []
    for column in sorted(new) if not old else _changed(old, new):
        value, before = new.get(column), old.get(column)
        if old and _category(value) is not None and _category(before) is not None:
            parts.append(f"{column}: {_category(before)} > {_category(value)}")
            continue
        seen = Counter(_words(before))
        gained = []
        for word in _words(value):
            if seen[word]:
                seen[word] -= 1
            else:
                gained.append(word)
        if gained:
            parts.append(f"{column}: {' '.join(gained)}")
    return " ".join(parts)


class Structure:
    """The fields and ngrams blocks, with their vocabulary fitted on training changes."""

    def __init__(self, prompts: Sequence[str], condition: str | None = None) -> None:
        counts: Counter[str] = Counter()
        for prompt in prompts:
            counts.update(set(field_tokens(prompt)))
        self.tokens = sorted(t for t, n in counts.items() if n >= MIN_COUNT)
        self.terms = condition_terms(condition)
        self._index = {t: i for i, t in enumerate(self.tokens)}
        self.vectorizer: Any = None
        texts = [delta_text(p) for p in prompts]
        if sum(bool(t) for t in texts) >= MIN_COUNT:
            from sklearn.feature_extraction.text import TfidfVectorizer

            vectorizer = TfidfVectorizer(
                analyzer="char_wb", ngram_range=(3, 5), min_df=MIN_COUNT, sublinear_tf=True,
                lowercase=True,
            )
            try:
                vectorizer.fit(texts)
                self.vectorizer = vectorizer
            except ValueError:
                pass  # no n-gram in two changes: no ngrams block

    def fields(self, prompts: Iterable[str]) -> np.ndarray:
        """Per change: its tokens one-hot, then each condition term it contains (0/1)."""
        prompts = list(prompts)
        rows = np.zeros((len(prompts), len(self.tokens) + len(self.terms)), dtype=np.float32)
        for i, prompt in enumerate(prompts):
            for token in field_tokens(prompt):
                if (j := self._index.get(token)) is not None:
                    rows[i, j] = 1.0
            said = _stems(delta_text(prompt))
            for j, term in enumerate(self.terms):
                rows[i, len(self.tokens) + j] = float(term in said)
        return rows

    def ngrams(self, prompts: Iterable[str]) -> np.ndarray:
        """Per change: TF-IDF of its new text's character n-grams (unit-length rows)."""
        prompts = list(prompts)
        if self.vectorizer is None:
            return np.zeros((len(prompts), 0), dtype=np.float32)
        matrix = self.vectorizer.transform([delta_text(p) for p in prompts])
        return np.asarray(matrix.todense(), dtype=np.float32)
