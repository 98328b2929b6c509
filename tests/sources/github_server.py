"""A fake GitHub REST API on loopback, at the wire level, with a clock tests control.

It serves ``GET /repos/{owner}/{repo}/issues`` like GitHub: ``state``, ``since``, ``sort``,
``direction``, ``per_page`` (capped at 100), ``page``; ``Link`` headers; an ``ETag`` on every
response and a 304 (which spends no budget) when ``If-None-Match`` matches. Each credential
(the ``Authorization`` value, or none) has a budget of ``limit`` requests per ``window``
seconds, reported in ``x-ratelimit-*`` headers; a spent budget answers 403 like GitHub's
primary limit. Modes script the rest: secondary limits, ``Retry-After``, 5xx on a page, and a
per-request delay (in real seconds) with a count of requests in flight.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

NOT_FOUND = json.dumps({"message": "Not Found"}).encode()
SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
)


class Clock:
    """A clock that moves only when told to, or when a client sleeps on it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """What a client calls instead of ``time.sleep``: records and moves the clock."""
        with self._lock:
            self.slept.append(seconds)
            self._now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def iso(epoch: float) -> str:
    """Epoch seconds as GitHub writes times."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


@dataclass
class Seen:
    """One request: path, query (last value per name), lowercased headers, clock time."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float


@dataclass
class _Window:
    reset: float
    used: int = 0


@dataclass
class Counters:
    """What the server did: responses by kind, and budget spent per credential."""

    requests: int = 0
    ok: int = 0
    not_modified: int = 0
    limited: int = 0  # 403/429 for rate limits, any kind
    failed: int = 0  # scripted 5xx
    spent: dict[str, int] = field(default_factory=dict)  # credential -> budget spent


class FakeGitHub:
    """The fake API; a context manager. ``base_url`` is what a source's ``base_url`` takes."""

    def __init__(self, clock: Clock | None = None, *, limit: int = 5000, window: float = 3600):
        self.clock = clock or Clock()
        self.limit, self.window = limit, window
        self.issues: dict[str, list[dict[str, Any]]] = {}
        self.received: list[Seen] = []
        self.counters = Counters()
        self.delay = 0.0  # real seconds spent on each request
        self.in_flight = self.max_in_flight = 0
        self._windows: dict[str, _Window] = {}
        self._secondary = 0
        self._retry_after: deque[tuple[int, str]] = deque()
        self._failures: dict[int, tuple[int, int]] = {}  # page -> (status, times left)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- data -------------------------------------------------------------------------------

    def add_issue(
        self, repo: str, number: int, updated_at: str, *, pull_request: bool = False, **fields: Any
    ) -> dict[str, Any]:
        """Add (or replace) an issue of ``repo`` ("owner/name"); returns it."""
        issue = {
            "id": int(hashlib.sha256(f"{repo}#{number}".encode()).hexdigest()[:8], 16),
            "number": number,
            "title": f"Issue {number}",
            "body": None,
            "state": "open",
            "user": {"login": "octocat"},
            "labels": [],
            "assignees": [],
            "comments": 0,
            "created_at": updated_at,
            "updated_at": updated_at,
            "closed_at": None,
            "html_url": f"https://github.com/{repo}/issues/{number}",
            **fields,
        }
        if pull_request:
            issue["pull_request"] = {"url": f"https://api.github.com/repos/{repo}/pulls/{number}"}
        with self._lock:
            listing = self.issues.setdefault(repo, [])
            listing[:] = [i for i in listing if i["number"] != number] + [issue]
        return issue

    def remove_issue(self, repo: str, number: int) -> None:
        """Delete an issue (GitHub's incremental listing shows no trace of it afterwards)."""
        with self._lock:
            self.issues[repo] = [i for i in self.issues.get(repo, []) if i["number"] != number]

    # --- modes ------------------------------------------------------------------------------

    def secondary_limit(self, times: int = 1) -> None:
        """The next ``times`` requests get GitHub's secondary-limit 403, with no headers."""
        self._secondary += times

    def retry_after(self, value: str, *, status: int = 429, times: int = 1) -> None:
        """The next ``times`` requests get ``status`` with ``Retry-After: value``."""
        self._retry_after.extend([(status, value)] * times)

    def fail_page(self, page: int, status: int = 502, times: int = 1) -> None:
        """Requests for ``page`` (of any listing) get ``status``, ``times`` times."""
        self._failures[page] = (status, times)

    def exhaust(self, credential: str = "") -> None:
        """Spend the whole budget of ``credential`` (a token, or "" for anonymous)."""
        with self._lock:
            self._window(credential).used = self.limit

    def remaining(self, credential: str = "") -> int:
        with self._lock:
            return self.limit - self._window(credential).used

    def reset_at(self, credential: str = "") -> float:
        with self._lock:
            return self._window(credential).reset

    # --- serving ----------------------------------------------------------------------------

    def _window(self, credential: str) -> _Window:
        now = self.clock.now()
        window = self._windows.get(credential)
        if window is None or now >= window.reset:
            window = self._windows[credential] = _Window(reset=float(int(now + self.window)))
        return window

    def _rate_headers(self, window: _Window) -> dict[str, str]:
        return {
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(max(0, self.limit - window.used)),
            "x-ratelimit-reset": str(int(window.reset)),
            "x-ratelimit-used": str(window.used),
            "x-ratelimit-resource": "core",
        }

    def _respond(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        parts = seen.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "repos" or parts[3] != "issues":
            return 404, {}, NOT_FOUND
        repo = f"{parts[1]}/{parts[2]}"
        auth = seen.headers.get("authorization", "")
        credential = auth.removeprefix("Bearer ").removeprefix("token ")
        with self._lock:
            self.counters.requests += 1
            if self._retry_after:
                status, value = self._retry_after.popleft()
                self.counters.limited += 1
                body = {"message": "Too many requests: retry later"}
                return status, {"Retry-After": value}, json.dumps(body).encode()
            if self._secondary:
                self._secondary -= 1
                self.counters.limited += 1
                return 403, {}, json.dumps({"message": SECONDARY_MESSAGE}).encode()
            window = self._window(credential)
            if window.used >= self.limit:
                self.counters.limited += 1
                body = {"message": "API rate limit exceeded for user."}
                return 403, self._rate_headers(window), json.dumps(body).encode()
            page = int(seen.query.get("page", "1"))
            status, times = self._failures.get(page, (0, 0))
            if times:
                self._failures[page] = (status, times - 1)
                self.counters.failed += 1
                return status, {}, json.dumps({"message": "Server Error"}).encode()
            if repo not in self.issues:
                return 404, self._rate_headers(window), NOT_FOUND
            body_bytes, links = self._listing(repo, seen)
            etag = f'W/"{hashlib.sha256(body_bytes).hexdigest()[:32]}"'
            headers = {"ETag": etag, "Content-Type": "application/json; charset=utf-8"}
            if links:
                headers["Link"] = links
            asked = seen.headers.get("if-none-match", "")
            if etag in (tag.strip() for tag in asked.split(",")):
                # Conditional requests that come back 304 do not count against the budget.
                self.counters.not_modified += 1
                return 304, {**headers, **self._rate_headers(window)}, b""
            window.used += 1
            self.counters.spent[credential] = self.counters.spent.get(credential, 0) + 1
            self.counters.ok += 1
            return 200, {**headers, **self._rate_headers(window)}, body_bytes

    def _listing(self, repo: str, seen: Seen) -> tuple[bytes, str]:
        query = seen.query
        issues = list(self.issues[repo])
        state = query.get("state", "open")
        if state != "all":
            issues = [i for i in issues if i["state"] == state]
        if "since" in query:
            since = _parse(query["since"])
            issues = [i for i in issues if _parse(i["updated_at"]) >= since]
        key = "updated_at" if query.get("sort") == "updated" else "created_at"
        issues.sort(key=lambda i: (_parse(i[key]), i["number"]))
        if query.get("direction", "desc") == "desc":
            issues.reverse()
        per_page = min(100, int(query.get("per_page", "30")))
        page = int(query.get("page", "1"))
        last = max(1, -(-len(issues) // per_page))
        chunk = issues[(page - 1) * per_page : page * per_page]

        def link(number: int, rel: str) -> str:
            params = urlencode({**query, "page": number})
            return f'<{self.base_url}{seen.path}?{params}>; rel="{rel}"'

        links = []
        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        return json.dumps(chunk).encode(), ", ".join(links)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                seen = Seen(
                    path=parts.path,
                    query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                    headers={name.lower(): value for name, value in self.headers.items()},
                    at=server.clock.now(),
                )
                with server._lock:
                    server.received.append(seen)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.delay:
                        time.sleep(server.delay)
                    status, headers, body = server._respond(seen)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return _Handler
