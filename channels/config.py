"""Settings of delivery channels and digests, as declared in the watches file."""

from __future__ import annotations

import re
import string
from datetime import date, timedelta
from typing import Annotated, Literal

from changewatch.sources.base import Duration, EnvVarName, Identifier
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "AppriseChannelConfig",
    "ChannelConfig",
    "ConsoleChannelConfig",
    "DeliveryConfig",
    "DigestConfig",
    "EmailChannelConfig",
    "FeedbackConfig",
    "FileChannelConfig",
    "RetryConfig",
    "WebhookChannelConfig",
]

# The fields a digest's subject template may use.
SUBJECT_FIELDS = ("count", "window", "name", "watches", "start", "end", "day")
# Without `start:`, a digest's days begin this long before the code location loads: enough
# for the Dagster UI to offer last week's digests, without a wall of unsent days.
DEFAULT_DIGEST_BACKFILL = timedelta(days=7)

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")


def _email(value: str) -> str:
    if not _EMAIL.match(value):
        raise ValueError(f"{value!r} is not an email address")
    return value


EmailAddress = Annotated[str, AfterValidator(_email)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def env_vars(self) -> list[str]:
        """Names of the environment variables this channel reads (none by default)."""
        return []


# About three days (the Standard Webhooks, Svix and Stripe anchors retry for one to three):
# 5 s, 5 min, 30 min, 2 h, 5 h, then every 10 h; 12 attempts over 2.8 days.
DEFAULT_RETRY_DELAYS = (5.0, 300.0, 1800.0, 7200.0, 18000.0) + (36000.0,) * 6


class RetryConfig(_Model):
    """When a failed send is tried again, and when a failing channel is paused.

    Given per channel (``retry:`` on a channel) or for all of them (``delivery: retry:``).
    """

    delays: list[Duration] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_DELAYS),
        min_length=1,
        description=(
            "Waits after the 1st, 2nd... failed attempt of one notification; after the last, "
            "the next failure dead-letters it (`changewatch redeliver` sends it again). "
            "Default: 5s, 5m, 30m, 2h, 5h, then 10h six times (12 attempts, about 3 days)."
        ),
    )
    jitter: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description=(
            "Each wait is moved by up to this fraction either way, so notifications that "
            "failed together do not all come back at the same instant."
        ),
    )
    pause_after: int = Field(
        default=5,
        ge=1,
        description=(
            "Consecutive temporary failures (5xx, timeouts, refused connections, SMTP 4xx) "
            "after which the channel is paused: none of its notifications are tried until a "
            "probe, due on the same schedule, gets through."
        ),
    )
    max_retry_after: Duration = Field(
        default=86400.0,
        gt=0,
        description=(
            "The longest `Retry-After` (on a 429 or 503) that is honoured as given; a longer "
            "one waits this long."
        ),
    )
    scale: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Multiplies every wait (delays and Retry-After): 0.001 turns three days into "
            "about four minutes, for a drill against a test receiver. 1 in production."
        ),
    )

    def total(self) -> float:
        """Seconds from the first attempt to the last, without jitter.

        >>> round(RetryConfig().total() / 86400, 1)
        2.8
        """
        return sum(self.delays) * self.scale


class _Channel(_Model):
    """Settings every channel has."""

    retry: RetryConfig | None = Field(
        default=None,
        description="This channel's retry schedule (default: `delivery: retry:`).",
    )


class ConsoleChannelConfig(_Channel):
    """Print each notification on standard output (and in the Dagster run log)."""

    name: Identifier = Field(description="The channel's name, which watches list.")
    type: Literal["console"] = Field(description="Standard output (and the Dagster run log).")


class FileChannelConfig(_Channel):
    """Append each notification as one JSON line to a file."""

    name: Identifier = Field(description="The channel's name, which watches list.")
    type: Literal["file"] = Field(description="A JSON-lines file.")
    path: str = Field(description="The file; a relative path is relative to the watches file.")


class EmailChannelConfig(_Channel):
    """Send each notification as an email over SMTP."""

    name: Identifier = Field(description="The channel's name, which watches and digests list.")
    type: Literal["email"] = Field(description="Email over SMTP.")
    host: str = Field(description="The SMTP server.")
    port: int = Field(default=587, gt=0, lt=65536, description="The SMTP port.")
    # starttls: plain connection upgraded with STARTTLS (port 587); ssl: TLS from the first
    # byte (port 465); none: no encryption (a local relay or a test server only).
    security: Literal["starttls", "ssl", "none"] = Field(
        default="starttls",
        description=(
            "`starttls` (port 587), `ssl` (TLS from the first byte, port 465) or `none` (a local "
            "relay only)."
        ),
    )
    username: str | None = Field(
        default=None, description="The SMTP login, if the server wants one."
    )
    password_env: EnvVarName | None = Field(
        default=None, description="The environment variable holding the SMTP password."
    )
    from_address: EmailAddress = Field(alias="from", description="The sender's address.")
    to: list[EmailAddress] = Field(min_length=1, description="The recipients.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds one send may take at most.")
    # A PEM bundle of CAs to trust for the server's certificate instead of the system's (a
    # private relay, a test server with a self-signed certificate). Not a secret.
    ca_file: str | None = Field(
        default=None,
        description=(
            "A PEM bundle of CAs to trust for the server's certificate instead of the system's."
        ),
    )

    def env_vars(self) -> list[str]:
        return [self.password_env] if self.password_env else []


class WebhookChannelConfig(_Channel):
    """POST each notification as JSON, signed per the Standard Webhooks scheme."""

    name: Identifier = Field(description="The channel's name, which watches list.")
    type: Literal["webhook"] = Field(description="An HTTP POST of JSON.")
    url: str = Field(description="Where to POST (http or https).")
    # A Standard Webhooks secret ("whsec_" + base64), read from this environment variable.
    secret_env: EnvVarName | None = Field(
        default=None,
        description=(
            "The environment variable holding a Standard Webhooks secret (`whsec_...`); unset: "
            "unsigned."
        ),
    )
    timeout: float = Field(default=10.0, gt=0, description="Seconds one POST may take at most.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must be http(s), got {value!r}")
        return value

    def env_vars(self) -> list[str]:
        return [self.secret_env] if self.secret_env else []


class AppriseChannelConfig(_Channel):
    """Send each notification through Apprise (Slack, Discord, Telegram, ntfy, Matrix...).

    Apprise URLs embed their tokens (`slack://T.../B.../xyz`), so the URL itself is read from
    the environment variable named here, like every other secret.
    """

    name: Identifier = Field(description="The channel's name, which watches list.")
    type: Literal["apprise"] = Field(
        description="Apprise (Slack, Discord, Telegram, ntfy, Matrix...)."
    )
    url_env: EnvVarName = Field(
        description="The environment variable holding the Apprise URL (it embeds tokens)."
    )
    timeout: float = Field(default=30.0, gt=0, description="Seconds one send may take at most.")

    def env_vars(self) -> list[str]:
        return [self.url_env]


ChannelConfig = Annotated[
    ConsoleChannelConfig
    | FileChannelConfig
    | EmailChannelConfig
    | WebhookChannelConfig
    | AppriseChannelConfig,
    Field(discriminator="type"),
]


class DeliveryConfig(_Model):
    """How notifications are delivered (the watches file's ``delivery:`` block)."""

    # How long a delivery may stay claimed ('sending') before it counts as cut short by a
    # crash: then sent again to a webhook or file, parked as dead for the other channels. It
    # must outlast any send (the config check wants twice every channel's timeout), or a slow
    # send would be taken for a crashed one.
    lease: Duration = Field(
        default=600.0,
        description=(
            "How long a send may stay claimed before it counts as cut short by a crash; at least "
            "twice every channel's timeout."
        ),
    )
    retry: RetryConfig = Field(
        default_factory=RetryConfig,
        description="The retry schedule of every channel without its own `retry:`.",
    )

    @field_validator("lease")
    @classmethod
    def _positive(cls, lease: float) -> float:
        if lease <= 0:
            raise ValueError("the delivery lease must be positive")
        return lease


class FeedbackConfig(_Model):
    """Signed feedback links in notifications, answered by `changewatch feedback-server`."""

    # Where people reach the feedback server (the links start with it).
    url: str = Field(
        description="Where people reach `changewatch feedback-server`; the links start with it."
    )
    # The HMAC key of the links' signatures, read from this environment variable.
    secret_env: EnvVarName = Field(
        default="CHANGEWATCH_FEEDBACK_SECRET",
        description="The environment variable holding the links' HMAC key.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"feedback url must be http(s), got {value!r}")
        return value.rstrip("/")

    def env_vars(self) -> list[str]:
        return [self.secret_env]


class DigestConfig(_Model):
    """A periodic email summarizing the notifications of the watches it covers."""

    name: Identifier = Field(description="The digest's name (its asset is `digest_<name>`).")
    cron: str = Field(default="0 8 * * *", description="When a day's digest is sent.")
    timezone: str = Field(
        default="UTC", description="The time zone of `cron` and of the digest's days."
    )
    # The email channel whose SMTP settings (and, unless `to` is given, recipients) it uses.
    # Without one the digest is only written to output_dir (the demo does this).
    channel: Identifier | None = Field(
        default=None,
        description="The email channel whose SMTP settings (and recipients, without `to`) it uses.",
    )
    to: list[EmailAddress] | None = Field(
        default=None, description="Recipients instead of the channel's."
    )
    watches: list[Identifier] = Field(
        min_length=1, description="The watches whose notifications it summarizes."
    )
    # Names the digest and, with a short name, stays within one 78-character header line.
    subject: str = Field(
        default="changewatch {name} digest for {day}: {count} change(s)",
        description=(
            "The subject; may use {count}, {window}, {name}, {watches}, {start}, {end}, {day}."
        ),
    )
    send_empty: bool = Field(
        default=False, description="Send a digest of a day without notifications too."
    )
    # Without a reachable SMTP server (the demo), digests are also written here as .eml/.html.
    output_dir: str | None = Field(
        default=None,
        description=(
            "A folder where each digest is also written as `.eml` and `.html`; relative to the "
            "watches file."
        ),
    )
    # The first day a digest exists for (backfills start here); default: a week ago.
    start: date | None = Field(
        default=None,
        description=(
            "The first day a digest exists for (backfills start here); default: a week ago."
        ),
    )

    @model_validator(mode="after")
    def _somewhere_to_go(self) -> DigestConfig:
        if self.channel is None and self.output_dir is None:
            raise ValueError("a digest needs an email channel, an output_dir, or both")
        return self

    def first_day(self, today: date) -> date:
        """The first day of the digest: `start`, else a week before `today`."""
        return self.start or today - DEFAULT_DIGEST_BACKFILL

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not a known time zone (e.g. 'Europe/Berlin')") from None
        return value

    @field_validator("subject")
    @classmethod
    def _known_subject_fields(cls, value: str) -> str:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        except ValueError as exc:
            raise ValueError(f"digest subject {value!r}: {exc}") from None
        unknown = [f for f in fields if f not in SUBJECT_FIELDS]
        if unknown:
            raise ValueError(
                f"digest subject: unknown field(s) {unknown}; use {', '.join(SUBJECT_FIELDS)}"
            )
        return value
