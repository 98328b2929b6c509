"""Errors raised by connectors.

SourceError
 +-- FetchError          a request failed for good (after retries), names source and URL path
 |    +-- RateLimited    the API's budget is spent: deferred to a later sync
 |    +-- LimitExceeded  a response or walk passed a named limit (size, deadline, pages)
 +-- PayloadError        a response could not be read as the records the source declares
"""

from __future__ import annotations


class SourceError(Exception):
    """Base class for every connector error."""


class FetchError(SourceError):
    """A request failed after the HTTP policy's retries ran out (``status``: the last HTTP
    status, when there was one)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PayloadError(SourceError):
    """A response body was not the JSON shape the source declares."""


class RateLimited(FetchError):
    """The API's rate budget is spent until ``retry_at`` (epoch seconds): try a later sync."""

    def __init__(self, message: str, *, retry_at: float) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class LimitExceeded(FetchError):
    """A response or a walk went past one of ``sources.limits``' bounds; the message names
    the setting to raise. Never retried: the same request would hit it again."""
