"""A fake OpenAI-compatible chat completions server on loopback, scriptable per request.

Real HTTP/1.1 (Content-Length, keep-alive) on 127.0.0.1, answering
``POST /v1/chat/completions`` and ``POST /chat/completions`` with bodies shaped like
OpenAI's. Queue replies with ``queue(...)``; every request received is recorded (headers and
parsed JSON body) in ``requests``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a completion whose message content is ``content`` (status 200)
    or an OpenAI-style error body (other statuses), sent after ``delay`` seconds."""

    status: int = 200
    content: str | None = None
    error: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 20
    finish_reason: str = "stop"
    # A 200 whose `choices` list is empty, as some OpenAI-compatible servers send on errors.
    no_choices: bool = False

    @classmethod
    def verdict(cls, verdict: Mapping[str, Any], **options: Any) -> Reply:
        """A verdict as Mode.JSON expects it: the JSON object is the message content."""
        return cls(content=json.dumps(dict(verdict)), **options)

    @classmethod
    def empty(cls, **options: Any) -> Reply:
        """A completion with ``"choices": []``."""
        return cls(no_choices=True, **options)

    @classmethod
    def text(cls, content: str, **options: Any) -> Reply:
        """Raw message content (invalid JSON, JSON missing fields...)."""
        return cls(content=content, **options)

    @classmethod
    def fail(
        cls,
        status: int,
        message: str = "The server had an error while processing your request.",
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Reply:
        """An HTTP error with OpenAI's error body ``{"error": {message, type, param, code}}``."""
        error = {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": code,
        }
        return cls(status=status, error=error, headers=dict(headers or {}), **options)


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # parsed JSON (or the raw text if it was not JSON)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    @property
    def text(self) -> str:
        """All message contents, joined."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


class _Server(ThreadingHTTPServer):
    # Handler threads are joined at close (after their sockets are shut down).
    daemon_threads = False
    block_on_close = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out and hang up are expected; anything else is reported.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeOpenAIServer:
    """Use as a context manager. ``base_url`` ends in ``/v1``, like OpenAI's."""

    def __init__(self, respond: Callable[[Request], Reply] | None = None) -> None:
        # Answers requests when nothing is queued: a stand-in model that reads the prompt.
        self.respond = respond
        self.requests: list[Request] = []
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()  # wakes delayed replies, which then send nothing
        self._server.shutdown()
        with self._server.connections_lock:
            connections = list(self._server.connections)
        for connection in connections:  # unblock handlers waiting on idle keep-alive sockets
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def queue(self, *replies: Reply) -> None:
        """Answer the next chat completion requests with ``replies``, one each, in order."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Replies queued but not served yet."""
        with self._lock:
            return len(self._replies)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if request.method != "POST" or request.path not in CHAT_PATHS:
                return Reply.fail(404, f"Unknown request URL: {request.method} {request.path}")
            if not self._replies:
                if self.respond is not None:
                    return self.respond(request)
                return Reply.fail(404, "nothing scripted for this request")
            return self._replies.popleft()

    def _render(self, reply: Reply, request: Request) -> bytes:
        if reply.status != 200:
            return json.dumps({"error": dict(reply.error or {})}).encode()
        model = request.body.get("model", "fake") if isinstance(request.body, dict) else "fake"
        completion = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": []
            if reply.no_choices
            else [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        return json.dumps(completion).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10  # idle keep-alive connections are dropped eventually

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                request = Request(
                    method=self.command,
                    path=self.path.split("?", 1)[0],
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                )
                reply = fake._next(request)
                if reply.delay and fake._closing.wait(reply.delay):
                    self.close_connection = True
                    return  # the server is closing: the client gave up long ago
                payload = fake._render(reply, request)
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_POST = _serve
            do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

        return _Handler


def label_judge(label: str) -> Callable[[Request], Reply]:
    """A stand-in model for `FakeOpenAIServer(respond=...)`: notifies exactly when the
    change it is shown carries ``label`` (its prompt holds the change's values as JSON)."""

    def respond(request: Request) -> Reply:
        notify = f'"{label}"' in request.text
        return Reply.verdict(
            {
                "reasoning": f"Only the {label} label makes this relevant.",
                "should_notify": notify,
                "urgency": "high" if notify else "low",
                "summary": f"A {label} issue." if notify else f"Not a {label} issue.",
                "confidence": 0.9,
            }
        )

    return respond
