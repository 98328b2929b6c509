"""A judge cascade: judges asked in order, each only about what the one before was unsure of.

``judge: [{model: local, condition: ...}, {model: gpt-4o-mini, when: unsure}]``: the first
judge answers every change; a verdict less sure than the next judge's ``unsure_below`` (0.8),
or no verdict at all, goes to that judge, whose verdict replaces it, and so on down the list.
A cheap judge settles the clear cases and an expensive one is asked only about the doubtful.

To evaluation (evaluators/evaluate.py) a cascade is one judge, built by ``make_judge``: one
judgement per change against the call caps and the daily budget, its verdict cached under the
cascade's own judge version (which covers every judge in it, so editing the cascade asks
again), the requests, tokens and latency of every judge asked added up in the outcome, and
``min_confidence`` applied to whichever verdict decides. That verdict's reasoning starts with
which judges were asked and why. When the last judge asked gives no verdict, the cascade gives
none (the change is held, or per ``on_unavailable``), with that judge's reason: an unsure
verdict is not a decision.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from changewatch.evaluators.config import LEARNED_MODEL, JudgeConfig
from changewatch.evaluators.judge import (
    ChangeForJudge,
    Judge,
    JudgeConfigError,
    JudgeOutcome,
    judge_version,
)
from changewatch.evaluators.verdict_limits import capped

if TYPE_CHECKING:  # numpy and scikit-learn load only for a watch that has a learned stage
    from changewatch.evaluators.learned import LearnedJudge

__all__ = ["AnyJudge", "Cascade", "cascade_label", "make_judge"]


def cascade_label(config: JudgeConfig) -> str:
    """The cascade's name in reports: its models in order.

    >>> cascade_label(JudgeConfig.model_validate(
    ...     [{"condition": "any outage", "model": "local"}, {"model": "big", "when": "unsure"}]))
    'local > big'
    """
    return " > ".join(judge.model for judge in config.judges())


class Cascade:
    """The judges of a cascade config, asked in turn. Close it (or use ``with``)."""

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self.version = judge_version(config)
        self.judges: list[Judge | LearnedJudge] = []
        try:
            for judge_config in config.judges():
                self.judges.append(_single(judge_config))
        except BaseException:
            self.close()
            raise
        # The cache's key with the cascade's version (which names every judge's model): the
        # first judge's identity, and that of any later local judge, whose file the version
        # cannot see.
        later = [j.model_id for j in self.judges[1:] if j.model_id != j.config.model]
        self.model_id = " > ".join([self.judges[0].model_id, *later])
        # Its name in eval results: every judge's identity in order.
        self.label = " > ".join(judge.model_id for judge in self.judges)

    @property
    def url(self) -> str:
        """The judges' endpoints in order, for messages."""
        return " > ".join(judge.url for judge in self.judges)

    def evaluate(self, change: ChangeForJudge) -> JudgeOutcome:
        """One judgement: the first judge, then each next one while the last was unsure.

        The outcome's ``stages`` holds each judge's own outcome, in the order asked.
        """
        stages: list[JudgeOutcome] = []
        for index, judge in enumerate(self.judges):
            if index:
                verdict = stages[-1].verdict
                # The learned stage gives a verdict only where it is sure (its threshold).
                learned = getattr(self.judges[index - 1], "learned", False)
                if verdict is not None and (
                    learned or verdict.confidence >= self.config.then[index - 1].unsure_below
                ):
                    break
            stages.append(judge.evaluate(change))
        final = stages[-1]
        verdict = final.verdict
        if verdict is not None and len(stages) > 1:
            note = self._why_asked(stages)
            verdict = capped(
                verdict.model_copy(update={"reasoning": f"{note} {verdict.reasoning}"}),
                max_reasoning=self.config.max_reasoning_chars,
                max_summary=self.config.max_summary_chars,
            )
        return replace(
            final,
            verdict=verdict,
            model=self.model_id,  # the cache's key, with the cascade's version
            judge_version=self.version,
            prompt_tokens=sum(s.prompt_tokens for s in stages),
            completion_tokens=sum(s.completion_tokens for s in stages),
            latency_ms=sum(s.latency_ms for s in stages),
            attempts=sum(s.attempts for s in stages),
            min_confidence=self.config.min_confidence,
            stages=tuple(stages),
        )

    def _why_asked(self, stages: list[JudgeOutcome]) -> str:
        """``[local: notify at 0.60, below 0.80; asked gpt-4o-mini.]``"""
        parts = []
        for index, stage in enumerate(stages[:-1]):
            below = self.config.then[index].unsure_below
            if stage.verdict is None and (stage.error or "").startswith("abstained"):
                parts.append(f"{stage.model}: {stage.error}")
            elif stage.verdict is None:
                parts.append(f"{stage.model}: no verdict ({stage.error})")
            else:
                said = "notify" if stage.verdict.should_notify else "skip"
                parts.append(
                    f"{stage.model}: {said} at {stage.verdict.confidence:.2f}, below {below:.2f}"
                )
        return f"[{'; '.join(parts)}; asked {stages[-1].model}.]"

    def __enter__(self) -> Cascade:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for judge in self.judges:
            judge.close()

    def __repr__(self) -> str:
        return f"Cascade({cascade_label(self.config)!r}, version={self.version!r})"


if TYPE_CHECKING:
    AnyJudge = Judge | Cascade | LearnedJudge
else:  # the learned stage's class loads with its extra (see _single)
    AnyJudge = Judge | Cascade


def _single(config: JudgeConfig) -> Judge | LearnedJudge:
    if config.model != LEARNED_MODEL:
        return Judge(config)
    try:
        from changewatch.evaluators.learned import LearnedJudge
    except ModuleNotFoundError:
        from changewatch.evaluators.learned_features import INSTALL_HINT

        raise JudgeConfigError(INSTALL_HINT) from None
    return LearnedJudge(config)


def make_judge(config: JudgeConfig) -> AnyJudge:
    """The judge of ``config``: a ``Cascade`` when it lists judges after the first."""
    return Cascade(config) if config.then else _single(config)
