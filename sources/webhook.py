"""A source's ``webhook:`` settings: where its provider POSTs change events, how they are signed.

The receiver (pipeline/webhooks/webhook_receiver.py) verifies each delivery with these settings and
keeps it in the webhook inbox; a sensor then syncs the source, through the same path as any sync.
With a webhook the source is still polled, as reconciliation, every ``reconcile`` instead of every
``interval`` (pipeline/triggers/webhook_sensor.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from changewatch.sources.limits import ByteSize
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

if TYPE_CHECKING:
    from changewatch.sources.base import SourceBase

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "PROVIDERS",
    "WebhookSettings",
    "webhook_problems",
    "webhook_provider",
]

# GitHub caps its payloads at 25 MB but issue events are a few KB; a larger body is more likely
# abuse than news, and the receiver holds a body in memory while it checks the signature.
DEFAULT_MAX_BODY_BYTES = 1 << 20
# github: X-Hub-Signature-256 / X-GitHub-Delivery; standard: Standard Webhooks (webhook-id,
# webhook-timestamp, webhook-signature); hmac: a hex HMAC-SHA256 of the body in one header.
PROVIDERS = ("github", "standard", "hmac")
_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,199}$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _duration(value: Any) -> float:
    from changewatch.sources.base import parse_duration  # base imports this module

    return parse_duration(value)


def _env_name(value: Any) -> str:
    from changewatch.sources.base import _env_name as check  # base imports this module

    return check(value)


def _path(value: Any) -> str:
    if not isinstance(value, str) or not _PATH.match(value) or "//" in value:
        raise ValueError(
            f"{value!r} is not a webhook path: start with '/', then letters, digits, '.', '_', "
            "'~', '-' and '/' (no query string)"
        )
    return value


def _header(value: Any) -> str:
    if not isinstance(value, str) or not _HEADER.match(value):
        raise ValueError(f"{value!r} is not an HTTP header name")
    return value


class WebhookSettings(BaseModel):
    """Where the provider POSTs (``path`` on the receiver) and the secret's variable.

    ``provider`` picks the signature scheme (default: ``github`` for a GitHub source, else
    ``standard``). ``hmac`` reads a hex HMAC-SHA256 of the body (``sha256=`` prefix allowed)
    from ``signature_header`` and the delivery id from ``id_header`` (a body without one is
    known by its hash). ``max_body_bytes`` bounds a delivery (larger is 413), ``tolerance``
    how far a Standard Webhooks timestamp may be from the receiver's clock (else 401), and
    ``reconcile`` how often the source is still polled to catch what a webhook missed.
    """

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, BeforeValidator(_path)] = Field(
        description="The path on the receiver (`changewatch webhooks`) the provider POSTs to."
    )
    secret_env: Annotated[str, BeforeValidator(_env_name)] = Field(
        description="The environment variable holding the signing secret."
    )
    provider: Literal["github", "standard", "hmac"] | None = Field(
        default=None,
        description=(
            "The signature scheme: `github`, `standard` (Standard Webhooks) or `hmac`; default: "
            "`github` for a GitHub source, else `standard`."
        ),
    )
    signature_header: Annotated[str, BeforeValidator(_header)] = Field(
        default="X-Signature-256",
        description="With `hmac`: the header holding the hex HMAC-SHA256 of the body.",
    )
    id_header: Annotated[str, BeforeValidator(_header)] = Field(
        default="X-Delivery-Id", description="With `hmac`: the header holding the delivery id."
    )
    max_body_bytes: ByteSize = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, description="Largest delivery accepted (larger: 413)."
    )
    tolerance: Annotated[float, BeforeValidator(_duration)] = Field(
        default=300.0,
        gt=0,
        description=(
            "How far a Standard Webhooks timestamp may be from the receiver's clock (else 401)."
        ),
    )
    reconcile: Annotated[float, BeforeValidator(_duration)] = Field(
        default=3600.0,
        gt=0,
        description="How often the source is still polled, to catch what a webhook missed.",
    )


def webhook_provider(source_type: str, settings: WebhookSettings) -> str:
    """The signature scheme a source's deliveries use.

    >>> settings = WebhookSettings(path="/hooks/gh", secret_env="GH_HOOK_SECRET")
    >>> webhook_provider("github", settings), webhook_provider("rest", settings)
    ('github', 'standard')
    """
    if settings.provider is not None:
        return settings.provider
    return "github" if source_type == "github" else "standard"


def webhook_problems(sources: Sequence[SourceBase]) -> list[tuple[tuple, str]]:
    """What the ``webhook:`` settings of ``sources`` get wrong together: (location, why)."""
    from changewatch.sources.fleet import is_fleet  # it imports the source types, they this

    problems: list[tuple[tuple, str]] = []
    paths: dict[str, str] = {}
    for index, source in enumerate(sources):
        if source.webhook is None:
            continue
        if is_fleet(source):
            # A fleet's runs name the targets to sync; a delivery would need mapping to one.
            problems.append((("sources", index, "webhook"), "fleets take no webhooks yet"))
            continue
        other = paths.setdefault(source.webhook.path, source.name)
        if other != source.name:
            where = ("sources", index, "webhook", "path")
            problems.append((where, f"source {other!r} receives at {source.webhook.path} already"))
    return problems
