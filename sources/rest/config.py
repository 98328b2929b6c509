"""Settings of a generic REST/JSON source: endpoint, pagination, auth and incremental cursor."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sources.base import EnvVarName, SourceBase

# Credentials belong in `auth` (read from the environment), never in the YAML file.
_SECRET_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- pagination -------------------------------------------------------------------------------


class NoPagination(_Model):
    """One request returns everything."""

    type: Literal["none"] = "none"


class PageNumberPagination(_Model):
    """``?page=1``, ``?page=2``, ... until a short or empty page (or ``total_pages_path``)."""

    type: Literal["page_number"]
    page_param: str = "page"
    start: int = 1
    page_size_param: str | None = None
    page_size: int | None = Field(default=None, gt=0)
    stop_on_empty: bool = True
    total_pages_path: str | None = None

    @model_validator(mode="after")
    def _can_stop(self) -> PageNumberPagination:
        if not self.stop_on_empty and self.total_pages_path is None:
            raise ValueError("page_number pagination without stop_on_empty needs total_pages_path")
        if self.page_size_param is not None and self.page_size is None:
            raise ValueError("page_size_param needs page_size")
        return self


class OffsetPagination(_Model):
    """``?offset=0&limit=100``, ``?offset=100&limit=100``, ... until a short or empty page."""

    type: Literal["offset"]
    offset_param: str = "offset"
    limit_param: str = "limit"
    limit: int = Field(default=100, gt=0)
    total_path: str | None = None


class LinkHeaderPagination(_Model):
    """Follow the RFC 8288 ``Link: <...>; rel="next"`` response header (GitHub style)."""

    type: Literal["link_header"]


class NextUrlPagination(_Model):
    """Follow a full next-page URL found at ``next_url_path`` in the body."""

    type: Literal["next_url"]
    next_url_path: str = "next"


class CursorPagination(_Model):
    """Send the body's ``cursor_path`` value back as ``cursor_param`` until it is empty."""

    type: Literal["cursor"]
    cursor_path: str = "next_cursor"
    cursor_param: str = "cursor"


PaginatorConfig = Annotated[
    NoPagination
    | PageNumberPagination
    | OffsetPagination
    | LinkHeaderPagination
    | NextUrlPagination
    | CursorPagination,
    Field(discriminator="type"),
]


# --- auth -------------------------------------------------------------------------------------


class BearerAuth(_Model):
    """``Authorization: Bearer <token>``."""

    type: Literal["bearer"]
    token_env: EnvVarName


class BasicAuth(_Model):
    """HTTP basic auth."""

    type: Literal["basic"]
    username_env: EnvVarName
    password_env: EnvVarName


class HeaderAuth(_Model):
    """A key sent in a request header."""

    type: Literal["header"]
    name: str = "X-API-Key"
    value_env: EnvVarName


class QueryAuth(_Model):
    """A key sent as a query parameter."""

    type: Literal["query"]
    name: str = "api_key"
    value_env: EnvVarName


AuthConfig = Annotated[BearerAuth | BasicAuth | HeaderAuth | QueryAuth, Field(discriminator="type")]


def auth_env_vars(auth: AuthConfig | None) -> list[str]:
    """Names of the environment variables ``auth`` reads."""
    if auth is None:
        return []
    if isinstance(auth, BasicAuth):
        return [auth.username_env, auth.password_env]
    if isinstance(auth, BearerAuth):
        return [auth.token_env]
    return [auth.value_env]


# --- the source -------------------------------------------------------------------------------


class Incremental(_Model):
    """How an incremental sync sends the stored cursor: ``?since=<cursor>``."""

    param: str = "since"
    format: Literal["iso", "unix"] = "iso"


class RestSourceConfig(SourceBase):
    """A JSON API endpoint listed page by page."""

    type: Literal["rest"]
    base_url: str
    path: str = ""
    params: dict[str, str | int | float | bool] = {}
    headers: dict[str, str] = {}
    records_path: str | None = None
    paginator: PaginatorConfig = NoPagination()
    incremental: Incremental | None = None
    auth: AuthConfig | None = None
    page_limit: int | None = Field(default=None, gt=0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {value!r}")
        if parts.query:
            raise ValueError("base_url must not have a query string: use params (or auth)")
        return value

    @field_validator("headers")
    @classmethod
    def _no_secret_headers(cls, value: dict[str, str]) -> dict[str, str]:
        secret = sorted(name for name in value if name.lower() in _SECRET_HEADERS)
        if secret:
            raise ValueError(f"headers {secret} look like credentials: configure them under auth")
        return value

    @model_validator(mode="after")
    def _incremental_param(self) -> RestSourceConfig:
        if self.sync == "incremental" and self.incremental is None:
            raise ValueError("an incremental REST source needs incremental: {param: ...}")
        return self

    @property
    def url(self) -> str:
        """``base_url`` joined with ``path``."""
        if not self.path:
            return self.base_url
        return f"{self.base_url.rstrip('/')}/{self.path.lstrip('/')}"

    def env_vars(self) -> list[str]:
        """Names of the environment variables the auth reads."""
        return auth_env_vars(self.auth)
