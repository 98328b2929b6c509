"""Settings of a generic REST/JSON source: endpoint, pagination, auth, incremental cursor,
parent listing and response actions."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from changewatch.sources.base import Duration, EnvVarName, Identifier, SourceBase
from changewatch.sources.limits import DEFAULT_PAGE_LIMIT
from changewatch.sources.targets import ForEach, placeholder_problem, schedule_problem
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

# Credentials belong in `auth` (read from the environment), never in the YAML file.
_SECRET_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}


def _no_secret_headers(value: dict[str, str]) -> dict[str, str]:
    secret = sorted(name for name in value if name.lower() in _SECRET_HEADERS)
    if secret:
        raise ValueError(f"headers {secret} look like credentials: configure them under auth")
    return value


# Request headers a config may hold: anything but credentials, which come from `auth`.
PublicHeaders = Annotated[dict[str, str], AfterValidator(_no_secret_headers)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- pagination -------------------------------------------------------------------------------


class NoPagination(_Model):
    """One request returns everything."""

    type: Literal["none"] = Field(default="none", description="One request returns everything.")


class PageNumberPagination(_Model):
    """``?page=1``, ``?page=2``, ... until a short or empty page (or ``total_pages_path``)."""

    type: Literal["page_number"] = Field(description="Page numbers.")
    page_param: str = Field(default="page", description="The query parameter of the page number.")
    start: int = Field(default=1, description="The first page's number.")
    page_size_param: str | None = Field(
        default=None, description="The query parameter of the page size (needs `page_size`)."
    )
    page_size: int | None = Field(
        default=None, gt=0, description="Records per page asked for; a shorter page ends the walk."
    )
    stop_on_empty: bool = Field(
        default=True, description="An empty page ends the walk (off: needs `total_pages_path`)."
    )
    total_pages_path: str | None = Field(
        default=None, description="Dotted path in the body of the number of pages."
    )

    @model_validator(mode="after")
    def _can_stop(self) -> PageNumberPagination:
        if not self.stop_on_empty and self.total_pages_path is None:
            raise ValueError("page_number pagination without stop_on_empty needs total_pages_path")
        if self.page_size_param is not None and self.page_size is None:
            raise ValueError("page_size_param needs page_size")
        return self


class OffsetPagination(_Model):
    """``?offset=0&limit=100``, ``?offset=100&limit=100``, ... until a short or empty page.

    ``overlap: N`` makes each page start N rows before the previous one ended, and checks
    that the new page holds one of those N rows (by primary key). A row deleted or moved off
    the listing ahead of the walk shifts the rest up; without overlap the next page would skip
    a row. When the check fails (the listing shifted by N or more) the walk steps back a page
    until it finds them again. Rows read twice are deduplicated by normalization.
    """

    type: Literal["offset"] = Field(description="Offsets and limits.")
    offset_param: str = Field(default="offset", description="The query parameter of the offset.")
    limit_param: str = Field(default="limit", description="The query parameter of the limit.")
    limit: int = Field(
        default=100, gt=0, description="Records per page; a shorter page ends the walk."
    )
    total_path: str | None = Field(
        default=None, description="Dotted path in the body of the total number of records."
    )
    overlap: int = Field(
        default=0,
        ge=0,
        description=(
            "Rows each page re-reads of the one before, to notice a listing that shifted (below "
            "`limit`)."
        ),
    )

    @model_validator(mode="after")
    def _overlap_below_limit(self) -> OffsetPagination:
        if self.overlap >= self.limit:
            raise ValueError("offset pagination's overlap must be smaller than its limit")
        return self


class LinkHeaderPagination(_Model):
    """Follow the RFC 8288 ``Link: <...>; rel="next"`` response header (GitHub style)."""

    type: Literal["link_header"] = Field(
        description='The `Link: <...>; rel="next"` response header.'
    )


class NextUrlPagination(_Model):
    """Follow a full next-page URL found at ``next_url_path`` in the body."""

    type: Literal["next_url"] = Field(description="A next-page URL in the body.")
    next_url_path: str = Field(
        default="next", description="Dotted path in the body of the next page's URL."
    )


class CursorPagination(_Model):
    """Send the body's ``cursor_path`` value back as ``cursor_param`` until it is empty."""

    type: Literal["cursor"] = Field(description="A cursor in the body.")
    cursor_path: str = Field(
        default="next_cursor",
        description="Dotted path in the body of the next cursor; empty ends the walk.",
    )
    cursor_param: str = Field(
        default="cursor", description="The query parameter the cursor is sent back as."
    )


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

    type: Literal["bearer"] = Field(description="`Authorization: Bearer <token>`.")
    token_env: EnvVarName = Field(description="The environment variable holding the token.")


class BasicAuth(_Model):
    """HTTP basic auth."""

    type: Literal["basic"] = Field(description="HTTP basic auth.")
    username_env: EnvVarName = Field(description="The environment variable holding the user name.")
    password_env: EnvVarName = Field(description="The environment variable holding the password.")


class HeaderAuth(_Model):
    """A key sent in a request header."""

    type: Literal["header"] = Field(description="A key in a request header.")
    name: str = Field(default="X-API-Key", description="The header's name.")
    value_env: EnvVarName = Field(description="The environment variable holding the key.")


class QueryAuth(_Model):
    """A key sent as a query parameter."""

    type: Literal["query"] = Field(description="A key in a query parameter.")
    name: str = Field(default="api_key", description="The query parameter's name.")
    value_env: EnvVarName = Field(description="The environment variable holding the key.")


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
    """How an incremental sync sends the stored cursor: ``?since=<cursor>``.

    ``lag`` (a duration: ``"5m"``, ``300``) is subtracted from the cursor before it is sent,
    so rows that show up late with an updated-at a little older than the newest one already
    seen are still fetched. Rows fetched again unchanged are no change (same content hash).
    """

    param: str = Field(default="since", description="The query parameter the cursor is sent as.")
    format: Literal["iso", "unix"] = Field(
        default="iso",
        description="How the cursor is sent: `iso` (ISO 8601) or `unix` (whole seconds).",
    )
    lag: Duration = Field(
        default=0.0,
        ge=0,
        description=(
            "Subtracted from the cursor before it is sent, to fetch rows that show up late."
        ),
    )


# `{parent.<field>}` in a child's path or params: a field (dotted path) of the parent record.
PLACEHOLDER = re.compile(r"\{parent\.([A-Za-z0-9_$@\-]+(?:\.[A-Za-z0-9_$@\-]+)*)\}")
Param = str | int | float | bool


class ParentListing(_Model):
    """The listing a child source walks once per record of.

    The source's ``path`` (and string ``params``) hold ``{parent.<field>}`` placeholders,
    resolved from each parent record (``/posts/{parent.id}/comments``). ``fields`` copies
    parent fields (dotted paths) into every child record under the given names
    (``{post_id: id}``), so the child table can key on ``(post_id, id)``. The parent listing
    uses the source's ``base_url``, ``headers`` and ``auth``, and its own ``path``,
    ``params``, ``records_path`` and ``paginator``; it is never filtered by the cursor.
    """

    path: str = Field(description="The parent listing's path on the source's `base_url`.")
    params: dict[str, Param] = Field(
        default={}, description="Query parameters of the parent listing."
    )
    records_path: str | None = Field(
        default=None,
        description=(
            "Dotted path of the records in each parent page; default: the body is the list."
        ),
    )
    paginator: PaginatorConfig = Field(
        default=NoPagination(), description="How the parent listing pages."
    )
    fields: dict[Identifier, str] = Field(
        default={},
        description=(
            "Parent fields (dotted paths) copied into every child record: `{child_column: "
            "parent_path}`."
        ),
    )


class ResponseAction(_Model):
    """What to do with a response of some status instead of failing: ``ignore`` it.

    An ignored response adds no records and ends its listing; with a parent, that is the one
    child walk (``{status: 404, action: ignore}``: the parent was deleted meanwhile).
    """

    status: int = Field(description="The HTTP status (201-299 or a 4xx other than 429).")
    action: Literal["ignore"] = Field(
        description="`ignore`: no records, and the listing (or child walk) ends."
    )

    @field_validator("status")
    @classmethod
    def _actionable(cls, value: int) -> int:
        if value == 429 or not (201 <= value <= 299 or 400 <= value <= 499):
            raise ValueError(
                f"status {value} cannot take an action: use 201-299 or a 4xx other than 429 "
                "(5xx and 429 are retried, 3xx redirects followed)"
            )
        return value


class RestSourceConfig(SourceBase):
    """A JSON API endpoint listed page by page (once per parent record, with ``parent``)."""

    type: Literal["rest"] = Field(description="A paginated JSON API.")
    base_url: str = Field(description="The API's origin (and base path).")
    path: str = Field(
        default="",
        description=(
            "The listing's path under `base_url`; may hold `{parent.<field>}` or `{target}`."
        ),
    )
    params: dict[str, Param] = Field(default={}, description="Query parameters of every request.")
    headers: PublicHeaders = Field(
        default={},
        description="Request headers that are not credentials (credentials go under `auth`).",
    )
    records_path: str | None = Field(
        default=None,
        description=(
            "Dotted path of the list of records in each page; default: the body is the list."
        ),
    )
    paginator: PaginatorConfig = Field(default=NoPagination(), description="How the listing pages.")
    incremental: Incremental | None = Field(
        default=None, description="How an incremental sync sends the cursor."
    )
    auth: AuthConfig | None = Field(
        default=None,
        description="How requests authenticate; the secrets come from environment variables.",
    )
    # Most pages one listing may take (the parent's, and each child walk, count separately);
    # a walk past it fails rather than sync a truncated listing.
    page_limit: int = Field(
        default=DEFAULT_PAGE_LIMIT,
        gt=0,
        description=(
            "Most pages one listing may take; past it the sync fails rather than keep a truncated "
            "listing."
        ),
    )
    parent: ParentListing | None = Field(
        default=None,
        description="A listing walked first: the source's path is walked once per parent record.",
    )
    # Applies to the source's own requests (each child walk), never to the parent listing:
    # an ignored parent listing would look like every child was deleted.
    response_actions: list[ResponseAction] = Field(
        default=[],
        description="Statuses of the source's own requests to ignore instead of failing.",
    )
    # A fleet (sources/fleet.py): one listing per target, `{target}` filled in the path or
    # params, each record stamped with its target in `target_column` (added to the columns
    # and in front of the primary key), each target synced on its own into the one table.
    for_each: ForEach | None = Field(
        default=None,
        description="A fleet: one listing per target, `{target}` filled in the path or params.",
    )
    target_column: Identifier = Field(
        default="target",
        description=(
            "A fleet's column that holds each record's target (put in front of the primary key)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _target_column(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("for_each") is None:
            return data
        column = data.get("target_column", "target")
        columns = data.get("columns")
        if isinstance(columns, dict) and column in columns:
            raise ValueError(
                f"column {column!r} is the fleet's target_column, filled by for_each: "
                "leave it out of columns (or name the target column otherwise)"
            )
        keys = data.get("primary_key")
        keys = [keys] if isinstance(keys, str) else list(keys or [])
        return {
            **data,
            "columns": {column: "text", **columns} if isinstance(columns, dict) else columns,
            "primary_key": keys if column in keys else [column, *keys],
        }

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {value!r}")
        if parts.query:
            raise ValueError("base_url must not have a query string: use params (or auth)")
        return value

    @model_validator(mode="after")
    def _incremental_param(self) -> RestSourceConfig:
        if self.sync == "incremental" and self.incremental is None:
            raise ValueError("an incremental REST source needs incremental: {param: ...}")
        return self

    @model_validator(mode="after")
    def _placeholders_need_parent(self) -> RestSourceConfig:
        templates = [self.path, *(v for v in self.params.values() if isinstance(v, str))]
        placed = any(PLACEHOLDER.search(t) for t in templates)
        if placed and self.parent is None:
            raise ValueError("{parent.<field>} placeholders need a parent: {path: ...} listing")
        if self.parent is not None and not placed:
            raise ValueError(
                "a source with a parent needs {parent.<field>} in its path or params "
                "(e.g. path: /posts/{parent.id}/comments)"
            )
        leftover = [t for t in templates if "{parent" in PLACEHOLDER.sub("", t)]
        if leftover:
            raise ValueError(f"malformed placeholder in {leftover[0]!r}: use {{parent.<field>}}")
        return self

    @model_validator(mode="after")
    def _fleet_placeholder(self) -> RestSourceConfig:
        templates = [self.path, *(v for v in self.params.values() if isinstance(v, str))]
        if self.for_each is None:
            if any("{target}" in t for t in templates):
                raise ValueError("{target} placeholders need for_each: {values: [...]}")
            return self
        if self.parent is not None:
            raise ValueError("for_each and parent do not go together: make the parent a fleet")
        if (problem := schedule_problem(self.cron, self.reconcile)) is not None:
            raise ValueError(problem)
        problem = placeholder_problem(templates)
        if problem is not None:
            raise ValueError(f"for_each: {problem}")
        return self

    @property
    def url(self) -> str:
        """``base_url`` joined with ``path`` (placeholders still in)."""
        return self.join(self.path)

    def join(self, path: str) -> str:
        """``base_url`` joined with ``path``."""
        if not path:
            return self.base_url
        return f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"

    def env_vars(self) -> list[str]:
        """Names of the environment variables the auth reads."""
        return auth_env_vars(self.auth)
