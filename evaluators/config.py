"""Settings of a watch: which changes matter (SQL filter, LLM judge), where they go, how often."""

from __future__ import annotations

import functools
from typing import Literal

from changewatch.sources.base import Duration, EnvVarName, Identifier
from changewatch.sources.polling import StopConditions
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["LEARNED_MODEL", "LOCAL_MODEL", "DedupePolicy", "JudgeConfig", "NextJudge", "Watch"]

# `model: local`: the bundled offline model (the `[local]` extra, evaluators/local_model.py).
LOCAL_MODEL = "local"
# The learned stage (evaluators/learned.py): a classifier trained on the watch's labels.
LEARNED_MODEL = "learned"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NextJudge(_Model):
    """A judge of a cascade after the first: asked only about the changes the judge before it
    was unsure of (evaluators/cascade.py). It shares the first judge's condition, examples,
    call caps, ``min_confidence`` (applied to whichever verdict decides) and
    ``on_unavailable``; the endpoint and its limits are its own."""

    model: str = Field(description="The model's name at its endpoint, or `local`.")
    # Which verdicts of the judge before come here: `unsure` (less sure than unsure_below).
    # A judge before it that gave no verdict at all (down, invalid answer) counts as unsure.
    when: Literal["unsure"] = Field(
        description="Which verdicts of the judge before come here: `unsure` (and none at all)."
    )
    unsure_below: float = Field(
        default=0.8, gt=0, le=1, description="A verdict less confident than this counts as unsure."
    )
    base_url: str | None = Field(
        default=None,
        description="An OpenAI-compatible endpoint; unset: the openai client's default.",
    )
    api_key_env: EnvVarName | None = Field(
        default=None, description="The environment variable holding the endpoint's API key."
    )
    timeout: float = Field(default=30.0, gt=0, description="Seconds one request may take at most.")
    context_tokens: int | None = Field(
        default=None,
        ge=1024,
        description=(
            "The model's context window, prompt and answer (default: local 4096, else 8192)."
        ),
    )
    max_answer_tokens: int = Field(default=512, ge=64, description="`max_tokens` of every request.")
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries of a request that failed or gave no valid verdict.",
    )
    price_per_mtok_input: float | None = Field(
        default=None, ge=0, description="USD per million prompt tokens, for cost metadata."
    )
    price_per_mtok_output: float | None = Field(
        default=None, ge=0, description="USD per million answer tokens, for cost metadata."
    )


class JudgeConfig(_Model):
    """An LLM asked, per change that passed the filter, whether it meets a condition."""

    condition: str = Field(
        min_length=3, description="What a change must show to be notified, in plain words."
    )
    examples: list[str] = Field(
        default=[], description="Changes that meet the condition, shown to the model."
    )
    negative_examples: list[str] = Field(
        default=[], description="Changes that do not, shown to the model."
    )
    # A model name of the endpoint, or `local`: the bundled model in this process, which needs
    # neither base_url nor api_key_env and ignores them (so `changewatch eval --model local`
    # can score any watch offline).
    model: str = Field(
        description="The model's name at its endpoint, or `local` (the bundled offline model)."
    )
    # Any OpenAI-compatible endpoint: OpenAI, Ollama (http://localhost:11434/v1), vLLM,
    # llama.cpp server. None: the openai client's default (OPENAI_BASE_URL or api.openai.com).
    base_url: str | None = Field(
        default=None,
        description=(
            "An OpenAI-compatible endpoint (OpenAI, Ollama, vLLM, llama.cpp); unset: the openai "
            "client's default."
        ),
    )
    api_key_env: EnvVarName | None = Field(
        default=None,
        description=(
            "The environment variable holding the endpoint's API key; none for local servers."
        ),
    )
    min_confidence: float = Field(
        default=0.5, ge=0, le=1, description="Least confidence of a `notify` verdict that notifies."
    )
    # What happens to a change when the judge cannot answer (unreachable, no valid verdict
    # after retries, call cap reached): hold it for the next run, notify anyway, or drop it.
    on_unavailable: Literal["hold", "notify", "drop"] = Field(
        default="hold",
        description=(
            "When the judge cannot answer: `hold` for the next run, `notify` anyway, or `drop`."
        ),
    )
    timeout: float = Field(default=30.0, gt=0, description="Seconds one request may take at most.")
    # The model's context window in tokens, prompt and answer together: a change whose prompt
    # would not fit has its longest values cut (evaluators/prompt_fit.py), and its verdict's
    # reasoning says so. Default: the local model's own (4096); 8192 for any other model
    # (raise it for models that take more, to show them more of large changes).
    context_tokens: int | None = Field(
        default=None,
        ge=1024,
        description=(
            "The model's context window, prompt and answer; longer values are cut to fit (default:"
            " local 4096, else 8192)."
        ),
    )
    # The longest answer asked for (`max_tokens` of every request). A verdict takes 100-300
    # tokens; a model that rambles is stopped here, not at the timeout (with a server still
    # generating for a client that left).
    max_answer_tokens: int = Field(default=512, ge=64, description="`max_tokens` of every request.")
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries of a request that failed or gave no valid verdict.",
    )
    max_calls_per_run: int = Field(
        default=50, gt=0, description="Most judge calls of one evaluation run; the rest are held."
    )
    # A daily budget of calls (UTC days), kept in the warehouse's `judge_spend`: beyond it
    # changes are held, never dropped, and judged once the next day's budget opens.
    max_calls_per_day: int | None = Field(
        default=None,
        gt=0,
        description=(
            "A daily budget of calls (UTC days); beyond it changes are held, never dropped."
        ),
    )
    # What is kept of an answer's text (in judge_cache, evaluations and notifications): a
    # model that rambles is cut here, with a note saying so, rather than stored whole.
    max_reasoning_chars: int = Field(
        default=4000, ge=100, description="What is kept of a verdict's reasoning."
    )
    max_summary_chars: int = Field(
        default=1000, ge=50, description="What is kept of a verdict's summary."
    )
    # USD per million tokens; with them, evaluations report what the judge cost.
    price_per_mtok_input: float | None = Field(
        default=None, ge=0, description="USD per million prompt tokens, for cost metadata."
    )
    price_per_mtok_output: float | None = Field(
        default=None, ge=0, description="USD per million answer tokens, for cost metadata."
    )
    threshold: float | None = Field(
        default=None,
        ge=0.5,
        le=1,
        description=(
            "`model: learned` only: decide where the calibrated probability is at least this "
            "sure (default: the threshold chosen on held-out labels when it was trained)."
        ),
    )
    retrain: str | None = Field(
        default="0 3 * * *",
        description=(
            "`model: learned` only: a cron schedule (UTC) on which the stage retrains from "
            "every label so far, as `changewatch train` does (the new model is used only if it "
            "scores no worse on held-out labels); null: only `changewatch train` and the UI."
        ),
    )
    # A cascade: the judges asked after this one, in order, each about what the one before was
    # unsure of. `judge: [{...first...}, {model: ..., when: unsure}]` is the same written as
    # a list (evaluators/cascade.py).
    then: list[NextJudge] = Field(
        default=[],
        description="A cascade: judges asked in turn about what the one before was unsure of.",
    )

    @model_validator(mode="before")
    @classmethod
    def _cascade_as_list(cls, data: object) -> object:
        # `judge: [first, next, ...]`: the first judge's settings, the others as `then`.
        if isinstance(data, list):
            if not data:
                raise ValueError("a judge cascade lists at least one judge")
            first, *rest = data
            if not isinstance(first, dict):
                return data  # pydantic says what is wrong with it
            if "when" in first:
                raise ValueError(
                    "the first judge of a cascade is asked about every change: no `when`"
                )
            return {**first, "then": [*first.get("then", []), *rest]}
        return data

    def judges(self) -> list[JudgeConfig]:
        """The judges of this config in order, each as a config of its own: this one (without
        its cascade), then each of ``then`` with this one's condition, examples and caps."""
        first = self.model_copy(update={"then": []})
        later = [
            first.model_copy(update=step.model_dump(exclude={"when", "unsure_below"}))
            for step in self.then
        ]
        return [first, *later]

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """What the tokens cost in USD, or None when no price is configured or this is a
        cascade (its tokens are added up over judges of different prices)."""
        if self.then or (self.price_per_mtok_input is None and self.price_per_mtok_output is None):
            return None
        return round(
            (
                prompt_tokens * (self.price_per_mtok_input or 0.0)
                + completion_tokens * (self.price_per_mtok_output or 0.0)
            )
            / 1e6,
            6,
        )

    def env_vars(self) -> list[str]:
        """The API key variables of this judge and of the judges of its cascade."""
        return [
            judge.api_key_env
            for judge in self.judges()
            if judge.model != LOCAL_MODEL and judge.api_key_env
        ]


# per_object: at most one notification per object, ever (until the condition changes).
# per_version: one per content version of the object (a new edit can notify again).
# per_transition: one per (old version -> new version) change.
DedupePolicy = Literal["per_object", "per_version", "per_transition"]


class Watch(_Model):
    """Changes of one or more sources that someone wants to hear about."""

    name: Identifier = Field(
        description="The watch's name (its asset is `eval_<name>`), unique in the file."
    )
    sources: list[Identifier] = Field(
        min_length=1,
        description="The sources whose changes it reads (`source: x` is short for `sources: [x]`).",
    )
    description: str | None = Field(default=None, description="What the watch is for, for people.")
    # A SQL boolean over one change (see evaluators/filters.py for the names it may use).
    where: str = Field(
        default="TRUE",
        description=(
            "A SQL boolean over one change (`kind`, `old.<col>`, `new.<col>`, `changed(<col>)`...)."
        ),
    )
    judge: JudgeConfig | None = Field(
        default=None,
        description="An LLM asked about each change that passed `where` (or a list: a cascade).",
    )
    channels: list[Identifier] = Field(
        default=[], description="The channels its notifications go to."
    )
    dedupe: DedupePolicy = Field(
        default="per_version",
        description=(
            "At most one notification `per_object`, `per_version` of the object, or "
            "`per_transition` between versions."
        ),
    )
    # Jinja templates (sandboxed) rendered per notification.
    title: str = Field(
        default="{{ watch }}: {{ kind }} of {{ source }} {{ key }}",
        description="Jinja template of each notification's title.",
    )
    body: str = Field(
        default="{{ summary }}", description="Jinja template of each notification's body."
    )
    url: str = Field(
        default="{{ current.html_url or current.url or '' }}",
        description="Jinja template of each notification's link.",
    )
    # The heading of this watch's section in digests (`title` is each notification's);
    # default: the name made readable, "closed_issues" -> "Closed issues".
    heading: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Its section's heading in digests; default: the name made readable.",
    )
    # Flap suppression: a notification waits this long after its change was detected, and is
    # not sent if the object came back to where it was meanwhile (see evaluators/debounce.py).
    debounce: Duration | None = Field(
        default=None,
        description=(
            "Wait this long before notifying, and say nothing if the object came back meanwhile."
        ),
    )
    # When the watch stops notifying until `changewatch resume` (sources/polling.py).
    stop: StopConditions = Field(
        default_factory=StopConditions,
        description="When the watch pauses until `changewatch resume`.",
    )

    @model_validator(mode="after")
    def _templates_parse(self) -> Watch:
        for name in ("title", "body", "url"):
            problem = _template_problem(getattr(self, name))
            if problem is not None:
                raise ValueError(f"{name} template: {problem}")
        return self

    @field_validator("debounce")
    @classmethod
    def _debounce_positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("debounce must be a positive duration (e.g. '10m')")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: object) -> object:
        # `source: x` is shorthand for `sources: [x]`.
        if isinstance(data, dict) and "source" in data and "sources" not in data:
            data = dict(data)
            data["sources"] = [data.pop("source")]
        return data


@functools.lru_cache(maxsize=1024)
def _template_problem(text: str) -> str | None:
    """Why template ``text`` does not parse, or None. Cached: most watches keep the default
    templates, and parsing them is most of loading a watch."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        SandboxedEnvironment().parse(text)
    except TemplateSyntaxError as error:
        return f"{error.message} (line {error.lineno})"
    return None
