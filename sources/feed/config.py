"""Settings of a feed source (RSS 0.9x/1.0/2.0, Atom 1.0, JSON Feed 1.x): one URL, sane defaults."""

from __future__ import annotations

from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from changewatch.sources.base import SourceBase
from changewatch.sources.limits import DEFAULT_MAX_ENTRIES
from changewatch.sources.rest.config import AuthConfig, PublicHeaders, auth_env_vars
from pydantic import Field, field_validator, model_validator

__all__ = ["DEFAULT_COLUMNS", "FeedSourceConfig"]

# Every field a feed entry becomes (see sources/feed/README.md). A source that declares no
# `columns` gets all of them; declaring `columns` replaces the whole set.
DEFAULT_COLUMNS: dict[str, str] = {
    "entry_id": "text",
    "title": "text",
    "link": "text",
    "summary": "text",
    "author": "text",
    "published_at": "timestamp",
    "updated_at": "timestamp",
    "tags": "text[]",
}


class FeedSourceConfig(SourceBase):
    """A syndication feed, fetched whole on every sync.

    Only ``name``, ``type``, ``url`` and ``table`` are required: the primary key defaults to
    ``entry_id``, the updated-at column to ``updated_at`` and the columns to
    ``DEFAULT_COLUMNS``. A feed lists only its latest entries, so an entry that drops out of
    it is never read as a delete, whatever ``sync`` says (see ``FeedSource.fetch``).
    """

    # A feed shows a window of recent entries: no walk lists everything, so no sweep.
    lists_everything: ClassVar[bool] = False

    type: Literal["feed"] = Field(description="An RSS, Atom or JSON feed.")
    url: str = Field(description="The feed's URL.")
    # Non-secret request headers (e.g. a different Accept); credentials go under `auth`.
    headers: PublicHeaders = Field(
        default={},
        description="Request headers that are not credentials (credentials go under `auth`).",
    )
    auth: AuthConfig | None = Field(
        default=None,
        description="How requests authenticate; the secrets come from environment variables.",
    )
    # Entries one response may list (counted before they are parsed; see sources/limits.py).
    max_entries: int = Field(
        default=DEFAULT_MAX_ENTRIES, gt=0, description="Most entries one response may list."
    )

    @model_validator(mode="before")
    @classmethod
    def _feed_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data.setdefault("columns", dict(DEFAULT_COLUMNS))
        data.setdefault("primary_key", ["entry_id"])
        # Default the cursor column only when it exists: explicit columns may leave it out.
        columns = data["columns"]
        if "updated_at" not in data and isinstance(columns, dict) and "updated_at" in columns:
            data["updated_at"] = "updated_at"
        return data

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an http(s) URL, got {value!r}")
        if parts.username or parts.password:
            raise ValueError("url must not hold credentials: configure them under auth")
        return value

    def env_vars(self) -> list[str]:
        """Names of the environment variables the auth reads."""
        return auth_env_vars(self.auth)
