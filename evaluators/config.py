"""Settings of a watch: which changes matter (SQL filter, LLM judge), where they go, how often."""

from __future__ import annotations

from typing import Literal

from changewatch.sources.base import Duration, EnvVarName, Identifier
from changewatch.sources.polling import StopConditions
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["LOCAL_MODEL", "DedupePolicy", "JudgeConfig", "Watch"]

# `model: local`: the bundled offline model (the `[local]` extra, evaluators/local_model.py).
LOCAL_MODEL = "local"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JudgeConfig(_Model):
    """An LLM asked, per change that passed the filter, whether it meets a condition."""

    condition: str = Field(min_length=3)
    examples: list[str] = []
    negative_examples: list[str] = []
    # A model name of the endpoint, or `local`: the bundled model in this process, which needs
    # neither base_url nor api_key_env and ignores them (so `changewatch eval --model local`
    # can score any watch offline).
    model: str
    # Any OpenAI-compatible endpoint: OpenAI, Ollama (http://localhost:11434/v1), vLLM,
    # llama.cpp server. None: the openai client's default (OPENAI_BASE_URL or api.openai.com).
    base_url: str | None = None
    api_key_env: EnvVarName | None = None
    min_confidence: float = Field(default=0.5, ge=0, le=1)
    # What happens to a change when the judge cannot answer (unreachable, no valid verdict
    # after retries, call cap reached): hold it for the next run, notify anyway, or drop it.
    on_unavailable: Literal["hold", "notify", "drop"] = "hold"
    timeout: float = Field(default=30.0, gt=0)
    # The model's context window in tokens, prompt and answer together: a change whose prompt
    # would not fit has its longest values cut (evaluators/prompt_fit.py), and its verdict's
    # reasoning says so. Default: the local model's own (4096); 8192 for any other model
    # (raise it for models that take more, to show them more of large changes).
    context_tokens: int | None = Field(default=None, ge=1024)
    # The longest answer asked for (`max_tokens` of every request). A verdict takes 100-300
    # tokens; a model that rambles is stopped here, not at the timeout (with a server still
    # generating for a client that left).
    max_answer_tokens: int = Field(default=512, ge=64)
    max_retries: int = Field(default=2, ge=0, le=10)
    max_calls_per_run: int = Field(default=50, gt=0)
    # A daily budget of calls (UTC days), kept in the warehouse's `judge_spend`: beyond it
    # changes are held, never dropped, and judged once the next day's budget opens.
    max_calls_per_day: int | None = Field(default=None, gt=0)
    # What is kept of an answer's text (in judge_cache, evaluations and notifications): a
    # model that rambles is cut here, with a note saying so, rather than stored whole.
    max_reasoning_chars: int = Field(default=4000, ge=100)
    max_summary_chars: int = Field(default=1000, ge=50)
    # USD per million tokens; with them, evaluations report what the judge cost.
    price_per_mtok_input: float | None = Field(default=None, ge=0)
    price_per_mtok_output: float | None = Field(default=None, ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """What the tokens cost in USD, or None when no price is configured."""
        if self.price_per_mtok_input is None and self.price_per_mtok_output is None:
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
        if self.model == LOCAL_MODEL:
            return []
        return [self.api_key_env] if self.api_key_env else []


# per_object: at most one notification per object, ever (until the condition changes).
# per_version: one per content version of the object (a new edit can notify again).
# per_transition: one per (old version -> new version) change.
DedupePolicy = Literal["per_object", "per_version", "per_transition"]


class Watch(_Model):
    """Changes of one or more sources that someone wants to hear about."""

    name: Identifier
    sources: list[Identifier] = Field(min_length=1)
    description: str | None = None
    # A SQL boolean over one change (see evaluators/filters.py for the names it may use).
    where: str = "TRUE"
    judge: JudgeConfig | None = None
    channels: list[Identifier] = []
    dedupe: DedupePolicy = "per_version"
    # Jinja templates (sandboxed) rendered per notification.
    title: str = "{{ watch }}: {{ kind }} of {{ source }} {{ key }}"
    body: str = "{{ summary }}"
    url: str = "{{ current.html_url or current.url or '' }}"
    # The heading of this watch's section in digests (`title` is each notification's);
    # default: the name made readable, "closed_issues" -> "Closed issues".
    heading: str | None = Field(default=None, min_length=1, max_length=200)
    # Flap suppression: a notification waits this long after its change was detected, and is
    # not sent if the object came back to where it was meanwhile (see evaluators/debounce.py).
    debounce: Duration | None = None
    # When the watch stops notifying until `changewatch resume` (sources/polling.py).
    stop: StopConditions = Field(default_factory=StopConditions)

    @model_validator(mode="after")
    def _templates_parse(self) -> Watch:
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import SandboxedEnvironment

        environment = SandboxedEnvironment()
        for name in ("title", "body", "url"):
            try:
                environment.parse(getattr(self, name))
            except TemplateSyntaxError as error:
                raise ValueError(
                    f"{name} template: {error.message} (line {error.lineno})"
                ) from None
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
