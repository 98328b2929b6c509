"""Shared fixtures: real warehouses (a DuckDB file, a PostgreSQL schema) and the demo API.

PostgreSQL tests never skip: if the server at $CHANGEWATCH_TEST_PG_URL (default: the local
trust-auth server) is down, they fail, so CI cannot pass without exercising Postgres.
"""

from __future__ import annotations

import importlib.util
import resource
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import pytest
from changewatch.evaluators import local_model
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from cw_testing import PG_URL, REPO

# tests/local runs the real local model: only where the `[local]` extra is installed (CI
# runs it in a venv of its own, `pytest tests/local`), so the README's test command works
# without a 7-minute llama.cpp build. Named explicitly without the extra, its tests fail.
collect_ignore = [] if local_model.available() else ["local"]
# tests/learn likewise needs the `[learn]` extra (torch, sentence-transformers, scikit-learn):
# .ci/run runs it in a venv with that extra.
if (
    importlib.util.find_spec("sklearn") is None
    or importlib.util.find_spec("sentence_transformers") is None
):
    collect_ignore.append("learn")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked `heavy` first: on two workers taking a file at a time, a file of several
    minutes started last would leave one worker running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)  # stable


_CPU_AT_SETUP = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this worker (all its threads) and of the children it has waited for."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_CPU_AT_SETUP] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Each test's CPU seconds (setup to teardown) as the `cpu_s` property of `--junitxml`
    reports: bench/test_tier_times.py sums them per file, to tell a slow file that works
    from one that waits."""
    try:
        return (yield)
    finally:
        if _CPU_AT_SETUP in item.stash:
            item.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_AT_SETUP], 3)))


@pytest.fixture(params=["duckdb", "postgres"])
def warehouse_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty warehouse URL on each backend."""
    if request.param == "duckdb":
        yield f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
        return
    yield from _fresh_pg_schema()


def _fresh_pg_schema() -> Iterator[str]:
    schema = f"cw_test_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    with adbc.connect(PG_URL) as con, con.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        con.commit()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL schema's warehouse URL, dropped afterwards."""
    yield from _fresh_pg_schema()


@pytest.fixture
def demo_api() -> Iterator[DemoAPIServer]:
    """The demo issue tracker (40 issues, seed 7) on a free loopback port."""
    with DemoAPIServer(DemoTracker(issues=40, seed=7)) as server:
        yield server


@pytest.fixture
def demo_env(
    demo_api: DemoAPIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> DemoAPIServer:
    """The demo API, with a copy of the bundled watches.yaml pointed at it.

    A copy, in the test's own folder: relative output paths in the file (notifications,
    digests) resolve next to it, so tests never write into the repository.
    """
    config = tmp_path / "watches.yaml"
    config.write_text((REPO / "watches.yaml").read_text())
    monkeypatch.setenv("CHANGEWATCH_DEMO_URL", demo_api.url)
    monkeypatch.setenv("CHANGEWATCH_CONFIG", str(config))
    return demo_api


# ---------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A self-signed certificate for 127.0.0.1 and localhost, made here with openssl."""
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed to make the test certificate"
    out = tmp_path_factory.mktemp("tls")
    cert, key = out / "cert.pem", out / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return TLSFiles(cert=cert, key=key)
