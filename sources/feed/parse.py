"""Feed documents -> plain JSON records, one per entry.

RSS 0.9x/1.0/2.0 and Atom go through feedparser; JSON Feed (which feedparser does not read) is
mapped here. Every format gives the same record shape (see README.md):

``entry_id``, ``title``, ``link``, ``summary``, ``author``, ``published_at``, ``updated_at``
(ISO-8601 UTC text or null), ``tags`` (list of terms), plus ``content`` and ``enclosures``
kept for the raw payload.
"""

from __future__ import annotations

import calendar
import hashlib
import html
import io
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

import feedparser
import orjson

__all__ = [
    "FEED_ACCEPT",
    "FeedFormatError",
    "FeedTooLong",
    "ParsedFeed",
    "fallback_id",
    "parse_feed",
]

# Sent as Accept unless the source's headers say otherwise: feeds first, any XML/JSON after.
FEED_ACCEPT = (
    "application/atom+xml, application/rss+xml, application/feed+json, "
    "application/rdf+xml;q=0.9, application/xml;q=0.8, text/xml;q=0.8, "
    "application/json;q=0.7, */*;q=0.5"
)

JSON_FEED_VERSION = "https://jsonfeed.org/version/"
_JSON_MEDIA_TYPES = {"application/feed+json", "application/json"}
_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_TAG = re.compile(r"<[^>]*>")
_BOM = b"\xef\xbb\xbf"
# An RSS <item> or Atom <entry> start tag, with or without a namespace prefix (RSS 1.0's rss:).
_ENTRY_TAG = re.compile(rb"<(?:[\w.-]+:)?(?:item|entry)(?=[\s/>])")


class FeedFormatError(ValueError):
    """The document is not a feed this module can read (the caller adds source and URL)."""


class FeedTooLong(ValueError):
    """The feed lists more entries than ``max_entries`` (the caller adds source and URL)."""

    def __init__(self, max_entries: int) -> None:
        super().__init__(f"the feed lists more than max_entries={max_entries} entries")
        self.max_entries = max_entries


@dataclass(frozen=True)
class ParsedFeed:
    """The records of one feed document and its format (feedparser's names, or ``json1x``)."""

    version: str
    records: list[dict[str, Any]]


def parse_feed(
    body: bytes,
    content_type: str | None = None,
    *,
    base_url: str = "",
    max_entries: int | None = None,
) -> ParsedFeed:
    """Records of every entry in ``body``, served as ``content_type``.

    Relative entry links and enclosure URLs are resolved against ``base_url`` (the feed's
    URL, without a query string) unless the document's ``xml:base`` says otherwise. Ids are
    kept as written: an RSS guid like ``1042`` stays ``1042`` whatever URL the feed moves to.
    Raises ``FeedFormatError`` when the body is not a feed: malformed XML with no entries,
    JSON that is not a JSON Feed, an HTML page, nothing at all; ``FeedTooLong`` when it
    lists more than ``max_entries`` entries, counted before feedparser builds any (it takes
    some 0.3 ms and 1 KB for each).
    """
    media_type = (content_type or "").split(";")[0].strip().lower()
    start = body.removeprefix(_BOM).lstrip()[:1]
    if start == b"{" or (media_type in _JSON_MEDIA_TYPES and start != b"<"):
        return _json_feed(body.removeprefix(_BOM), base_url, max_entries)
    if max_entries is not None and _entry_tags(body, max_entries + 1) > max_entries:
        raise FeedTooLong(max_entries)
    return _xml_feed(body, content_type, base_url)


def _entry_tags(body: bytes, stop: int) -> int:
    """Entry start tags in ``body``, counted up to ``stop``.

    An upper bound of the entries (a literal tag in a CDATA section counts too).

    >>> _entry_tags(b"<rss><channel><item>a</item><item/><items/></channel></rss>", 10)
    2
    """
    found = 0
    for _ in _ENTRY_TAG.finditer(body):
        found += 1
        if found >= stop:
            break
    return found


def fallback_id(link: str | None, title: str | None, summary: str | None) -> str:
    """A stable id for an entry without guid/id: SHA-256 of link and title (hex, 32 chars).

    Only when both are missing does the summary stand in, so an entry keeps its id while
    its text is edited. The same entry gets the same id on every poll.
    """
    material = f"{link or ''}\n{title or ''}"
    if not (link or title):
        material = f"\n\n{summary or ''}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


# --- RSS / Atom (feedparser) ------------------------------------------------------------------


def _xml_feed(body: bytes, content_type: str | None, base_url: str) -> ParsedFeed:
    # A stream, never bytes: feedparser treats a bytes argument that names a file as a path.
    # No content-location: feedparser would resolve relative permalink guids against it, and
    # an id must not change when the feed's URL does. Links are resolved below instead.
    headers = {"content-type": content_type} if content_type else {}
    parsed = feedparser.parse(io.BytesIO(body), response_headers=headers)
    entries = parsed.get("entries") or []
    version = parsed.get("version") or ""
    if not entries:
        if not body.strip():
            raise FeedFormatError("is empty")
        if not version:
            kind = content_type or "no content-type"
            raise FeedFormatError(f"is not an RSS, Atom or JSON feed ({kind})")
        if parsed.get("bozo"):
            problem = str(parsed.get("bozo_exception") or "unreadable").splitlines()[0][:200]
            raise FeedFormatError(f"is not a well-formed feed ({problem})")
    # Atom entries without an author inherit the feed's (RFC 4287 section 4.2.1).
    inherited = _feedparser_author(parsed.get("feed") or {}) if version.startswith("atom") else None
    return ParsedFeed(version, [_xml_record(entry, inherited, base_url) for entry in entries])


def _xml_record(
    entry: Mapping[str, Any], inherited_author: str | None, base_url: str
) -> dict[str, Any]:
    # dict.get, not entry.get: feedparser's own `updated` falls back to `published` with a
    # DeprecationWarning; the fallback is done explicitly below.
    title = _plain_text(dict.get(entry, "title"), dict.get(entry, "title_detail"))
    link = _url(dict.get(entry, "link"), base_url)
    summary = _str(dict.get(entry, "summary"))
    published = _from_struct(dict.get(entry, "published_parsed"))
    updated = _from_struct(dict.get(entry, "updated_parsed")) or published
    return {
        "entry_id": _str(dict.get(entry, "id")) or fallback_id(link, title, summary),
        "title": title,
        "link": link,
        "summary": summary,
        "author": _feedparser_author(entry) or inherited_author,
        "published_at": published,
        "updated_at": updated,
        "tags": _terms(tag.get("term") or tag.get("label") for tag in entry.get("tags") or ()),
        "content": [
            {"type": _str(part.get("type")), "value": part.get("value")}
            for part in entry.get("content") or ()
        ],
        "enclosures": [
            {
                "href": _url(enclosure.get("href"), base_url),
                "type": _str(enclosure.get("type")),
                "length": _length(enclosure.get("length")),
            }
            for enclosure in entry.get("enclosures") or ()
        ],
    }


# RSS `<author>` is an e-mail address, optionally followed by the name in parentheses.
_EMAIL_AND_NAME = re.compile(r"\s*[^\s@()]+@[^\s@()]+(?:\s*\((?P<name>.*)\))?\s*")


def _feedparser_author(item: Mapping[str, Any]) -> str | None:
    """The author's name, or the e-mail address when that is all there is.

    >>> _feedparser_author({"author": "ops@status.example (Ops Team)"})
    'Ops Team'
    >>> _feedparser_author({"author": "jane@x.example"})
    'jane@x.example'
    """
    text = _str(dict.get(item, "author"))
    # feedparser splits "email (Name)" with an e-mail pattern that knows only 2-4 letter
    # TLDs: "x@host.example (Jane)" comes back as name "ple (Jane". So the split is ours.
    if text and (match := _EMAIL_AND_NAME.fullmatch(text)):
        return _str(match["name"]) or text.strip()
    # `author_detail.name` is an Atom <name> (feedparser's `author` adds the e-mail to it).
    detail = dict.get(item, "author_detail") or {}
    return _str(detail.get("name")) or text


def _plain_text(value: Any, detail: Mapping[str, Any] | None) -> str | None:
    text = _str(value)
    if text and detail and detail.get("type") in _HTML_TYPES:
        # An Atom `type="html"` title arrives as markup; a title column wants the words.
        text = _str(html.unescape(_TAG.sub("", text)))
    return text


def _from_struct(value: Any) -> str | None:
    # feedparser's *_parsed values are UTC struct_times.
    if not isinstance(value, time.struct_time):
        return None
    try:
        return _iso(datetime.fromtimestamp(calendar.timegm(value), UTC))
    except (OverflowError, OSError, ValueError):
        return None


# --- JSON Feed 1.0 / 1.1 ----------------------------------------------------------------------


def _json_feed(body: bytes, base_url: str, max_entries: int | None) -> ParsedFeed:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise FeedFormatError("is neither JSON nor an RSS/Atom feed") from None
    version = document.get("version") if isinstance(document, dict) else None
    if not (isinstance(version, str) and version.startswith(JSON_FEED_VERSION)):
        raise FeedFormatError(f"is JSON but not a JSON Feed (no version {JSON_FEED_VERSION}...)")
    items = document.get("items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise FeedFormatError("is a JSON Feed whose items are not a list of objects")
    if max_entries is not None and len(items) > max_entries:
        raise FeedTooLong(max_entries)
    label = "json" + version.removeprefix(JSON_FEED_VERSION).replace(".", "")
    # Items without authors have the feed's (JSON Feed 1.1, "authors").
    inherited = _json_author(document)
    return ParsedFeed(label, [_json_record(item, inherited, base_url) for item in items])


def _json_record(
    item: dict[str, Any], inherited_author: str | None, base_url: str
) -> dict[str, Any]:
    title = _str(item.get("title"))
    link = _url(item.get("url"), base_url) or _url(item.get("external_url"), base_url)
    html_content, text_content = _str(item.get("content_html")), _str(item.get("content_text"))
    summary = _str(item.get("summary")) or html_content or text_content
    published = _from_rfc3339(item.get("date_published"))
    updated = _from_rfc3339(item.get("date_modified")) or published
    raw_id = item.get("id")
    # The spec says string; some feeds write numbers. Booleans and objects are not ids.
    is_id = isinstance(raw_id, str) or (isinstance(raw_id, int) and not isinstance(raw_id, bool))
    entry_id = _str(str(raw_id)) if is_id else None
    tags = item.get("tags")
    attachments = item.get("attachments")
    return {
        "entry_id": entry_id or fallback_id(link, title, summary),
        "title": title,
        "link": link,
        "summary": summary,
        "author": _json_author(item) or inherited_author,
        "published_at": published,
        "updated_at": updated,
        "tags": _terms(tags if isinstance(tags, list) else ()),
        "content": [
            {"type": kind, "value": value}
            for kind, value in (("text/html", html_content), ("text/plain", text_content))
            if value is not None
        ],
        "enclosures": [
            {
                "href": _url(attachment.get("url"), base_url),
                "type": _str(attachment.get("mime_type")),
                "length": _length(attachment.get("size_in_bytes")),
            }
            for attachment in (attachments if isinstance(attachments, list) else ())
            if isinstance(attachment, dict)
        ],
    }


def _json_author(holder: Mapping[str, Any]) -> str | None:
    # 1.1 has `authors` (a list); 1.0 had `author` (one object).
    authors = holder.get("authors")
    candidates = authors if isinstance(authors, list) else [holder.get("author")]
    for author in candidates:
        if isinstance(author, dict) and (name := _str(author.get("name"))):
            return name
    return None


def _from_rfc3339(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            moment = parsedate_to_datetime(text)  # an RFC 822 date, as RSS habits go
        except (TypeError, ValueError):
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # no offset given: read as UTC
    return _iso(moment)


# --- shared -----------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _str(value: Any) -> str | None:
    """Stripped text, or None when missing or blank."""
    if not isinstance(value, str):
        return None
    return value.strip() or None


def _url(value: Any, base_url: str) -> str | None:
    text = _str(value)
    return urljoin(base_url, text) if text and base_url else text


def _terms(values: Iterable[Any]) -> list[str]:
    # In order, each once: a repeated category must not make a list differ between polls.
    return list(dict.fromkeys(term for value in values if (term := _str(value))))


def _length(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None
