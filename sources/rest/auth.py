"""Credentials for a REST source, read from the environment at request time."""

from __future__ import annotations

import base64
import os

from changewatch.sources.errors import FetchError
from changewatch.sources.rest.config import AuthConfig, BasicAuth, BearerAuth, HeaderAuth, QueryAuth


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise FetchError(f"environment variable {name} is not set (the source's auth needs it)")
    return value


def credentials(auth: AuthConfig | None) -> tuple[dict[str, str], dict[str, str]]:
    """The ``(headers, query params)`` that carry ``auth``; both empty without auth.

    Values are secrets: callers pass them to the request and nowhere else.
    """
    if auth is None:
        return {}, {}
    if isinstance(auth, BearerAuth):
        return {"Authorization": f"Bearer {_env(auth.token_env)}"}, {}
    if isinstance(auth, BasicAuth):
        pair = f"{_env(auth.username_env)}:{_env(auth.password_env)}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode('ascii')}"}, {}
    if isinstance(auth, HeaderAuth):
        return {auth.name: _env(auth.value_env)}, {}
    if isinstance(auth, QueryAuth):
        return {}, {auth.name: _env(auth.value_env)}
    raise TypeError(f"unknown auth type {type(auth).__name__}")
