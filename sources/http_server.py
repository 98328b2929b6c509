"""The life of a small threaded HTTP server: bind (naming the address if it cannot), serve
in a background thread or this one, stop, and close. The feedback server and the webhook
receiver are both one of these around their own request handler."""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["ThreadedServer"]


class ThreadedServer:
    """Serves ``handler`` on ``host:port`` (0 picks a free port); handlers reach this object
    as ``self.server.app``. Raises OSError naming the address when the port is taken."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        name: str,
        log: logging.Logger,
    ) -> None:
        self._name = name
        try:
            self._httpd = _HTTPServer((host, port), self, handler, log)
        except OSError as error:
            # Name the address: "Address already in use" alone does not say which.
            raise OSError(error.errno, error.strerror, f"{host}:{port}") from None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"  # never a key

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=self._name, daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self._httpd.serve_forever()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False  # a second server on a taken port must fail, not share it

    def __init__(
        self,
        address: tuple[str, int],
        app: ThreadedServer,
        handler: type[BaseHTTPRequestHandler],
        log: logging.Logger,
    ) -> None:
        self.app = app
        self._log = log
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exception(), OSError):
            return  # a client hanging up or stalling mid-request
        self._log.exception("%s: request failed", self.app._name)
