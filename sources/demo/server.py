"""The demo API: a GitHub-like issues endpoint over HTTP, served from a DemoTracker."""

from __future__ import annotations

import argparse
import math
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import orjson
from changewatch.sources.demo.tracker import DemoTracker, parse_ts

MAX_PER_PAGE = 100  # GitHub silently caps per_page at 100; so do we
_ISSUES_PATH = re.compile(r"^/repos/([^/]+)/([^/]+)/issues(?:/([^/]+))?/?$")
# An owner's repositories (those the server has trackers for), as GitHub lists an org's.
_REPOS_PATH = re.compile(r"^/orgs/([^/]+)/repos/?$")
_NOT_FOUND = orjson.dumps({"message": "Not Found"})
# Allowed values of the enumerated list parameters; the first is GitHub's default.
_CHOICES: dict[str, tuple[str, ...]] = {
    "state": ("open", "closed", "all"),
    "sort": ("created", "updated"),
    "direction": ("desc", "asc"),
}


class _HTTPServer(ThreadingHTTPServer):
    """Threaded server that tracks open connections so ``stop()`` can end keep-alive ones."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: DemoAPIServer) -> None:
        self.api = api
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-response is normal for a test fixture; stay quiet about it.
        if isinstance(sys.exception(), OSError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a paging client reuses one connection
    server_version = "changewatch-demo/0.1"
    disable_nagle_algorithm = True  # headers and body must not wait for the client's ACK
    wbufsize = 1 << 16  # buffer writes so headers and a small body leave in one packet
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a benchmark makes thousands of requests."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- routing ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        body = self._read_body()
        if body is None:
            return
        url = urlsplit(self.path)
        path = url.path
        api = self.server.api
        if path.startswith("/_demo/"):
            # Control endpoints are not counted: stats describe what the client under test did.
            self._control(method, path, body)
            return
        api.count(path)
        if method == "GET" and (org := _REPOS_PATH.match(path)) is not None:
            self._send_json(200, api.repos(org.group(1)))
            return
        match = _ISSUES_PATH.match(path)
        if method != "GET" or match is None:
            self._send(404, _NOT_FOUND)
            return
        owner, repo, number = match.groups()
        tracker = api.trackers.get(f"{owner}/{repo}".lower())
        if tracker is None:
            self._send(404, _NOT_FOUND)
        elif number is None:
            self._list_issues(tracker, path, url.query)
        else:
            numeric = number.isascii() and number.isdigit()  # int() takes more than ASCII digits
            blob = tracker.issue_json(int(number)) if numeric else None
            if blob is None:
                self._send(404, _NOT_FOUND)
            else:
                self._send(200, blob)

    def _control(self, method: str, path: str, body: bytes) -> None:
        api = self.server.api
        if method == "POST" and path == "/_demo/mutate":
            try:
                request = orjson.loads(body or b"{}")
                if not isinstance(request, dict) or set(request) - {"create", "update", "delete"}:
                    raise ValueError("body must be an object with create, update and delete")
                result = api.tracker.mutate(**request)
            except (ValueError, TypeError) as error:  # orjson.JSONDecodeError is a ValueError
                self._send_json(422, {"message": str(error)})
                return
            self._send_json(200, result)
        elif method == "GET" and path == "/_demo/stats":
            self._send_json(200, api.stats())
        elif method == "POST" and path == "/_demo/reset-stats":
            api.reset_stats()
            self._send_json(200, api.stats())
        else:
            self._send(404, _NOT_FOUND)

    def _list_issues(self, tracker: DemoTracker, path: str, query: str) -> None:
        pairs = parse_qsl(query, keep_blank_values=True)
        params = dict(pairs)  # a repeated parameter: the last one wins
        errors: list[dict[str, str]] = []
        choices = {}
        for name, allowed in _CHOICES.items():
            choices[name] = value = params.get(name, allowed[0])
            if value not in allowed:
                errors.append(_invalid(name, f"must be one of {', '.join(allowed)}"))
        since = params.get("since")
        if since is not None:
            try:
                parse_ts(since)
            except (ValueError, OverflowError):
                errors.append(_invalid("since", "must be an ISO 8601 timestamp"))
        page = _positive_int(params, "page", 1, errors)
        per_page = min(_positive_int(params, "per_page", 30, errors), MAX_PER_PAGE)
        if errors:
            self._send_json(422, {"message": "Validation Failed", "errors": errors})
            return
        result = tracker.page(
            state=choices["state"],
            since=since,
            sort=choices["sort"],
            direction=choices["direction"],
            page=page,
            per_page=per_page,
        )
        last = max(1, math.ceil(result.total / per_page))
        host = self.headers.get("Host") or self.server.api.url.removeprefix("http://")
        link = _link_header(f"http://{host}{path}", pairs, page, last)
        self._send(200, result.body, [("Link", link)] if link else [])

    # -- plumbing --------------------------------------------------------------------------

    def _read_body(self) -> bytes | None:
        """The request body, read in full so the next request on the connection starts clean."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # chunked uploads are not supported; drop the stream
            self._send_json(411, {"message": "Length Required"})
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send_json(400, {"message": "Bad Content-Length"})
            return None
        return self.rfile.read(length) if length else b""

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, orjson.dumps(payload))

    def _send(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def _invalid(field: str, message: str) -> dict[str, str]:
    """One entry of a 422 response's ``errors``, shaped like GitHub's."""
    return {"resource": "Issue", "field": field, "code": "invalid", "message": f"{field} {message}"}


def _positive_int(params: dict[str, str], name: str, default: int, errors: list[Any]) -> int:
    """An integer query parameter of at least 1; problems are appended to ``errors``."""
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        errors.append(_invalid(name, "must be a whole number >= 1"))
    return value


def _link_header(base: str, pairs: list[tuple[str, str]], page: int, last: int) -> str:
    """GitHub's ``Link`` header: prev, next, last, first, each keeping the other parameters."""
    kept = [(key, value) for key, value in pairs if key != "page"]

    def url(target: int) -> str:
        return f"{base}?{urlencode([*kept, ('page', target)], quote_via=quote, safe=':')}"

    links = []
    if page > 1:
        links.append(f'<{url(page - 1)}>; rel="prev"')
    if page < last:
        links.append(f'<{url(page + 1)}>; rel="next"')
        links.append(f'<{url(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{url(1)}>; rel="first"')
    return ", ".join(links)


class DemoAPIServer:
    """Serves a :class:`DemoTracker` over HTTP from a background thread.

    ``port=0`` picks a free port; read the address from :attr:`url` after :meth:`start`.
    ``more`` trackers (of other repositories) are served beside the first, and
    ``/orgs/{owner}/repos`` lists an owner's repositories among them.
    """

    def __init__(
        self,
        tracker: DemoTracker | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        more: Iterable[DemoTracker] = (),
    ) -> None:
        self.tracker = tracker if tracker is not None else DemoTracker()
        self.trackers = {t.repo.lower(): t for t in (self.tracker, *more)}
        self.host = host
        self.port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self._requests = 0
        self._by_path: dict[str, int] = {}

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8765``."""
        if self._httpd is None:
            raise RuntimeError("the demo API server is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    def start(self) -> DemoAPIServer:
        """Bind the socket and serve in a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("the demo API server is already running")
        try:
            self._httpd = _HTTPServer((self.host, self.port), self)
        except OSError as error:  # say where: "address in use" alone does not name the port
            raise OSError(
                error.errno, f"cannot listen on {self.host}:{self.port}: {error.strerror}"
            ) from error
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.01},  # stop() waits up to this long; tests stop a lot
            name=f"demo-api-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end open keep-alive connections and close the listening socket."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        httpd.shutdown()
        with httpd.connections_lock:
            open_connections = list(httpd.connections)
        for connection in open_connections:
            try:  # wakes the handler thread blocked on reading the next request
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> DemoAPIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def repos(self, owner: str) -> list[dict[str, Any]]:
        """The repositories of ``owner`` served here, as GitHub lists an organization's."""
        return [
            {"full_name": t.repo, "name": t.repo.partition("/")[2], "issues": len(t)}
            for t in sorted(self.trackers.values(), key=lambda t: t.repo.lower())
            if t.repo.partition("/")[0].lower() == owner.lower()
        ]

    def count(self, path: str) -> None:
        """Record one served request."""
        with self._stats_lock:
            self._requests += 1
            self._by_path[path] = self._by_path.get(path, 0) + 1

    def stats(self) -> dict[str, Any]:
        """Requests served (control endpoints excluded), per path, and the current issue count."""
        with self._stats_lock:
            stats = {"requests": self._requests, "by_path": dict(self._by_path)}
        stats["issues"] = len(self.tracker)
        return stats

    def reset_stats(self) -> None:
        """Zero the request counters."""
        with self._stats_lock:
            self._requests = 0
            self._by_path = {}


def main(argv: list[str] | None = None) -> int:
    """Run the demo API in the foreground until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m changewatch.sources.demo.server",
        description="Serve the changewatch demo issue API.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8765, help="0 picks a free port (default: %(default)s)"
    )
    parser.add_argument(
        "--issues", type=int, default=50, help="issues to generate (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    tracker = DemoTracker(issues=args.issues, seed=args.seed)
    with DemoAPIServer(tracker, host=args.host, port=args.port) as server:
        print(
            f"demo API serving {tracker.repo} ({len(tracker)} issues) at {server.url}", flush=True
        )
        print(f"  try: curl '{server.url}/repos/{tracker.repo}/issues?state=all'", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
