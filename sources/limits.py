"""Named bounds on what one sync accepts from an API: response size, deadlines and pages.

Each is a setting of every source (``SourceBase``) with the default below, and each error
names the source, the request (host and path: never a query string, which may hold a key)
and the setting to raise. ``read_body`` applies the size cap and both deadlines while a
response streams in, counting *decoded* bytes (inflated a bounded step at a time, see
``sources.inflate``), so a gzip bomb is stopped soon after inflation passes the cap.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from changewatch.sources.errors import FetchError, LimitExceeded
from changewatch.sources.inflate import decoded_chunks
from pydantic import BeforeValidator

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_PAGE_LIMIT",
    "DEFAULT_RESPONSE_TIMEOUT",
    "DEFAULT_SYNC_TIMEOUT",
    "ByteSize",
    "Deadline",
    "format_size",
    "parse_size",
    "read_body",
    "too_slow",
]

# A JSON page or feed bigger than this is a bug or an attack rather than data: real APIs page
# long before (GitHub's 100-issue pages are well under 1 MiB).
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# From sending a request to its last byte. httpx's own timeout is per read, so a server that
# sends one byte a second would otherwise hold a sync for ever.
DEFAULT_RESPONSE_TIMEOUT = 120.0
# A whole sync's walk: every page, retry and rate-limit wait.
DEFAULT_SYNC_TIMEOUT = 1800.0
# Pages of one listing. 50,000 pages is five million records at 100 a page, or a million at
# 20: more than any listing we sync, yet an endless next link stops (about 12 minutes at
# 15 ms a page, before the sync deadline).
DEFAULT_PAGE_LIMIT = 50_000
# Entries of one feed. Feeds show their latest 10 to a few hundred; podcasts' archives reach a
# few thousand. feedparser takes some 0.3 ms and 1 KB an entry, so a feed of a million tiny
# entries (27 MB) would take minutes and a gigabyte before this.
DEFAULT_MAX_ENTRIES = 10_000

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNIT_BYTES = {"k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2, "g": 1000**3, "gi": 1024**3}


def parse_size(value: Any) -> int:
    """Bytes from a number or a string such as ``"64MiB"``, ``"500 kB"``, ``"1GB"``.

    >>> parse_size("64MiB"), parse_size(1024), parse_size("500 kB"), parse_size("2 KiB")
    (67108864, 1024, 500000, 2048)
    """
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '64MiB'")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size (use e.g. 1048576, '500kB', '64MiB', '1GiB')")
    unit = (match.group(2) or "b").lower().removesuffix("b")
    return int(float(match.group(1)) * _UNIT_BYTES.get(unit, 1))


ByteSize = Annotated[int, BeforeValidator(parse_size)]


def format_size(size: int) -> str:
    """``size`` bytes as people write them.

    >>> format_size(64 * 1024 * 1024), format_size(1536), format_size(100)
    ('64 MiB', '1.5 KiB', '100 bytes')
    """
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{size / factor:.4g} {unit}"
    return f"{size} bytes"


def _seconds(value: float) -> str:
    return f"{value:g}s"


@dataclass(frozen=True)
class Deadline:
    """The moment (``time.monotonic``) a sync's walk must be done, and the setting behind it.

    Real elapsed time, not the injectable clock of rate-limit tests: it bounds what a sync
    really costs.
    """

    at: float
    seconds: float
    setting: str = "sync_timeout"

    @classmethod
    def after(cls, seconds: float, setting: str = "sync_timeout") -> Deadline:
        """The deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds, setting)

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.at - time.monotonic()

    def check(self, what: object) -> None:
        """Raise ``LimitExceeded`` naming ``what`` (a request) once the deadline passed."""
        if self.left() <= 0:
            raise LimitExceeded(self.message(what))

    def message(self, what: object) -> str:
        return (
            f"{what}: the sync passed {self.setting} ({_seconds(self.seconds)}); raise the "
            f"source's {self.setting} if the API is that slow"
        )


def too_slow(what: object, timeout: float) -> LimitExceeded:
    """The error of a response that took longer than ``timeout`` seconds."""
    return LimitExceeded(
        f"{what}: the response took longer than response_timeout ({_seconds(timeout)}); "
        "raise the source's response_timeout if the API is that slow"
    )


def read_body(
    response: httpx.Response,
    what: object,
    *,
    max_bytes: int,
    timeout: float,
    started: float,
    deadline: Deadline | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """Read a streamed ``response`` whole, or raise ``LimitExceeded`` (and close it).

    Stops at ``max_bytes`` decoded bytes, at ``timeout`` seconds after ``started`` (a
    ``clock`` reading taken before the request was sent), and at ``deadline``. Time is
    checked as each chunk arrives; a silent connection trips httpx's read timeout, which the
    caller sets no longer than what is left. The body is then the response's ``content``.
    """
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in decoded_chunks(response):
            size += len(chunk)
            if size > max_bytes:
                raise LimitExceeded(
                    f"{what}: the response passed max_response_bytes ({format_size(max_bytes)}); "
                    "raise the source's max_response_bytes if it is really that big"
                )
            if clock() - started > timeout:
                raise too_slow(what, timeout)
            if deadline is not None:
                deadline.check(what)
            chunks.append(chunk)
    except httpx.DecodingError as exc:
        response.close()
        raise FetchError(f"{what}: the response could not be decoded ({exc})") from None
    except BaseException:
        response.close()
        raise
    body = b"".join(chunks)
    # What httpx's own Response.read() does, so `content` (and `json()`) work as usual.
    response._content = body
    response.close()
    return body
