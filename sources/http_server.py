"""The life of a small threaded HTTP server: bind (naming the address if it cannot), serve
in a background thread or this one, stop, and close. The feedback server and the webhook
receiver are both one of these around their own request handler.

A connection costs a thread only once its request line and headers have arrived whole: until
then one selector loop holds it (a few hundred bytes), and closes it when they take longer
than ``header_timeout`` seconds or pass ``MAX_HEADER_BYTES``. At most ``max_connections`` wait
so (a new one closes the longest waiting), and ``workers`` threads answer the requests whose
headers are in. So a thousand sockets that send a byte a second hold neither threads nor the
requests that arrive whole: those are answered as they come.
"""

from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_WORKERS",
    "MAX_HEADER_BYTES",
    "ThreadedServer",
]

# Threads answering requests whose headers are in (the server's whole thread budget, plus
# the selector loop's own).
DEFAULT_WORKERS = 16
# Seconds a connection may take to send its request line and headers.
DEFAULT_HEADER_TIMEOUT = 10.0
# Connections waiting for their headers at once; past it the longest waiting is closed.
DEFAULT_MAX_CONNECTIONS = 4096
# A request line and headers past this are refused (431) and the connection closed.
MAX_HEADER_BYTES = 64 << 10
_END_OF_HEADERS = b"\r\n\r\n"


class ThreadedServer:
    """Serves ``handler`` on ``host:port`` (0 picks a free port); handlers reach this object
    as ``self.server.app``. Raises OSError naming the address when the port is taken.

    ``workers``, ``header_timeout`` and ``max_connections``: see the module's docstring.
    """

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        name: str,
        log: logging.Logger,
        workers: int = DEFAULT_WORKERS,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._name = name
        try:
            self._httpd = _HTTPServer(
                (host, port),
                self,
                handler,
                log,
                workers=workers,
                header_timeout=header_timeout,
                max_connections=max_connections,
            )
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


class _Waiting:
    """A connection whose headers are not in yet: what it sent so far, and since when."""

    __slots__ = ("address", "data", "since", "sock")

    def __init__(self, sock: socket.socket, address: Any, since: float) -> None:
        self.sock, self.address, self.since, self.data = sock, address, since, b""


class _Connection:
    """An accepted socket whose first bytes were read already: ``makefile("rb")`` gives them
    back first, so the request handler reads the request as sent."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self._sock, self._head = sock, head

    def makefile(self, mode: str = "r", buffering: int = -1, **kwargs: Any) -> Any:
        if "r" not in mode:
            return self._sock.makefile(mode, buffering, **kwargs)
        raw = _Prefixed(self._head, self._sock)
        return io.BufferedReader(raw, buffer_size=io.DEFAULT_BUFFER_SIZE)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Prefixed(io.RawIOBase):
    def __init__(self, head: bytes, sock: socket.socket) -> None:
        self._head, self._sock = head, sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._sock.recv_into(buffer)


class _Workers:
    """Up to ``count`` daemon threads, started as work comes, that run what ``submit`` gives.

    Daemon threads, as ThreadingHTTPServer's were: a worker waiting on a stalled client's body
    must not hold up the process's exit (a ThreadPoolExecutor's threads are joined at exit).
    """

    def __init__(self, count: int, name: str) -> None:
        self._count, self._name = count, name
        self._queue: queue.SimpleQueue[tuple[Any, tuple] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0

    def submit(self, function: Any, *args: Any) -> None:
        with self._lock:
            self._queue.put((function, args))
            # Another thread only when the waiting work outnumbers the idle ones.
            if self._queue.qsize() > self._idle and self._started < self._count:
                self._started += 1
                name = f"{self._name}-{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            for _ in range(self._started):
                self._queue.put(None)
            self._started = 0

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._queue.get()
            with self._lock:
                self._idle -= 1
            if job is None:
                return
            function, args = job
            function(*args)


class _HTTPServer(HTTPServer):
    # SO_REUSEADDR, so a server killed and started again binds at once: the connections it
    # closed hold its port in TIME_WAIT for a minute, and without it the restart failed with
    # "Address already in use" (bench/bench_hosts_webhooks.py). On Linux and BSD it never lets
    # a second server bind a port one listens on; on Windows it would, so not there.
    allow_reuse_address = sys.platform != "win32"
    # The listen backlog: socketserver's 5 drops the connections of a burst (their clients
    # retry a second or more later); the kernel caps it at net.core.somaxconn.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        app: ThreadedServer,
        handler: type[BaseHTTPRequestHandler],
        log: logging.Logger,
        *,
        workers: int,
        header_timeout: float,
        max_connections: int,
    ) -> None:
        self.app = app
        self._log = log
        self._header_timeout = header_timeout
        self._max_connections = max_connections
        self._workers = _Workers(workers, f"{app._name}-worker")
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, gather each connection's headers, hand whole ones to a worker; until
        ``shutdown``."""
        self._stopping.clear()
        self._stopped.clear()
        self.socket.setblocking(False)
        waiting: OrderedDict[int, _Waiting] = OrderedDict()  # oldest first
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stopping.is_set():
                    for key, _ in selector.select(min(poll_interval, self._header_timeout / 4)):
                        if key.fileobj is self.socket:
                            self._accept(selector, waiting)
                        else:
                            self._read(selector, waiting, waiting[key.fd])
                    self._expire(selector, waiting)
            finally:
                for pending in waiting.values():
                    pending.sock.close()
                self._stopped.set()

    def shutdown(self) -> None:
        self._stopping.set()
        self._stopped.wait()
        self._workers.stop()

    def _accept(self, selector: selectors.BaseSelector, waiting: OrderedDict) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of file descriptors, or the client left: the next try may do
            sock.setblocking(False)
            if len(waiting) >= self._max_connections:
                # Whole requests arrive in one go: the longest waiting is the likeliest stall.
                _, oldest = waiting.popitem(last=False)
                selector.unregister(oldest.sock)
                oldest.sock.close()
            waiting[sock.fileno()] = _Waiting(sock, address, time.monotonic())
            selector.register(sock, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, waiting: OrderedDict, one: _Waiting) -> None:
        try:
            chunk = one.sock.recv(MAX_HEADER_BYTES + 1 - len(one.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(selector, waiting, one)
            return
        one.data += chunk
        if _END_OF_HEADERS in one.data:
            selector.unregister(one.sock)
            del waiting[one.sock.fileno()]
            one.sock.setblocking(True)
            self._workers.submit(self._answer, one.sock, one.address, one.data)
        elif len(one.data) > MAX_HEADER_BYTES:
            self._refuse(one.sock, b"431 Request Header Fields Too Large")
            self._drop(selector, waiting, one)

    def _expire(self, selector: selectors.BaseSelector, waiting: OrderedDict) -> None:
        deadline = time.monotonic() - self._header_timeout
        while waiting:
            oldest = next(iter(waiting.values()))
            if oldest.since > deadline:
                return
            self._refuse(oldest.sock, b"408 Request Timeout")
            self._drop(selector, waiting, oldest)

    @staticmethod
    def _drop(selector: selectors.BaseSelector, waiting: OrderedDict, one: _Waiting) -> None:
        selector.unregister(one.sock)
        waiting.pop(one.sock.fileno(), None)
        one.sock.close()

    @staticmethod
    def _refuse(sock: socket.socket, status: bytes) -> None:
        try:  # best effort: a stalled client may not read it, and must not hold this loop
            sock.send(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass

    def _answer(self, sock: socket.socket, address: Any, head: bytes) -> None:
        """In a worker: the handler reads the request (its head already here) and answers."""
        connection = _Connection(sock, head)
        try:
            self.finish_request(connection, address)
        except Exception:  # noqa: BLE001 - one request's failure is logged, the server goes on
            self.handle_error(connection, address)
        finally:
            self.shutdown_request(sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exception(), OSError):
            return  # a client hanging up or stalling mid-request
        self._log.exception("%s: request failed", self.app._name)

    def server_close(self) -> None:
        super().server_close()
        self._workers.stop()
