"""HttpClient against a real loopback server: retries, backoff, Retry-After, errors, secrecy."""

from __future__ import annotations

import logging
import random
import socket
from email.utils import formatdate

import httpx
import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.errors import FetchError
from changewatch.sources.http import HttpClient, HttpPolicy, retry_after_seconds
from changewatch.sources.ratelimit import RateLimits

SECRET = "s3cr3t-value-123"


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


NOW = 1_700_000_000.0


def make_client(delays: list[float], **policy: float) -> HttpClient:
    """A client whose sleeps are recorded in ``delays`` instead of waited, on a stopped clock
    and with its own rate-limit registry."""
    return HttpClient(
        policy=HttpPolicy(**policy),
        sleep=delays.append,
        now=lambda: NOW,
        rng=random.Random(7),
        limits=RateLimits(),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_get_merges_params_into_the_url_query(api):
    api.queue("/x", Reply.json({"ok": True}))
    delays: list[float] = []
    with make_client(delays) as client:
        response = client.get(api.url("/x?a=1"), params={"b": 2}, headers={"X-Extra": "yes"})
        assert response.json() == {"ok": True}
        assert client.requests == 1
    seen = api.received[0]
    assert seen.query == {"a": "1", "b": "2"}
    assert seen.headers["x-extra"] == "yes"
    assert seen.headers["user-agent"] == "changewatch/0.1"
    assert delays == []


def test_retries_500_503_429_with_exponential_backoff(api):
    api.queue(
        "/flaky",
        Reply.json({}, status=500),
        Reply.json({}, status=503),
        Reply.json({}, status=429),
        Reply.json([1]),
    )
    delays: list[float] = []
    with make_client(delays, backoff_base=1.0, backoff_max=100.0) as client:
        assert client.get(api.url("/flaky")).json() == [1]
        assert client.requests == 4
    assert len(delays) == 3
    for attempt, delay in enumerate(delays):
        # Equal jitter: within the upper half of a window that doubles each retry.
        assert 2**attempt / 2 <= delay <= 2**attempt
    assert delays[0] < delays[2]


def test_backoff_is_capped_and_reproducible_with_a_seed():
    policy = HttpPolicy(backoff_base=1.0, backoff_max=8.0)
    first = [policy.backoff(n, random.Random(3)) for n in range(1, 10)]
    again = [policy.backoff(n, random.Random(3)) for n in range(1, 10)]
    assert first == again
    assert max(first) <= 8.0
    assert min(first[4:]) >= 4.0


def test_retry_after_seconds_is_honoured(api):
    api.queue("/slow", Reply.json({}, status=503, Retry_After="7"), Reply.json([]))
    delays: list[float] = []
    with make_client(delays) as client:
        client.get(api.url("/slow"))
    assert delays == [7.0]


def test_retry_after_http_date_is_honoured(api):
    now = 1_700_000_000.0
    api.queue(
        "/slow",
        Reply.json({}, status=429, Retry_After=formatdate(now + 12, usegmt=True)),
        Reply.json([]),
    )
    delays: list[float] = []
    client = HttpClient(sleep=delays.append, now=lambda: now, limits=RateLimits())
    with client:
        client.get(api.url("/slow"))
    assert delays == [12.0]


def test_retry_after_above_the_cap_is_deferred_without_sleeping(api):
    api.queue("/limited", Reply.json({}, status=429, Retry_After="3600"))
    delays: list[float] = []
    with make_client(delays, max_wait=120.0) as client:
        with pytest.raises(FetchError, match="deferred") as info:
            client.get(api.url("/limited"), params={"api_key": SECRET})
        assert client.requests == 1
    assert delays == []
    assert "/limited" in str(info.value)
    assert SECRET not in str(info.value)


def test_gives_up_after_max_retries_naming_path_and_status_only(api):
    api.route("/flaky", lambda request: Reply.json({"echo": SECRET}, status=503))
    delays: list[float] = []
    with make_client(delays, max_retries=2) as client:
        with pytest.raises(FetchError) as info:
            client.get(api.url("/flaky"), params={"api_key": SECRET}, headers={"X-Token": SECRET})
        assert client.requests == 3
    message = str(info.value)
    assert "/flaky" in message and "503" in message and "3 attempts" in message
    assert SECRET not in message and "api_key" not in message
    assert len(delays) == 2


def test_connection_refused_is_retried_then_fails():
    delays: list[float] = []
    with make_client(delays, max_retries=2) as client:
        with pytest.raises(FetchError, match="ConnectError") as info:
            client.get(f"http://127.0.0.1:{free_port()}/down", params={"api_key": SECRET})
        assert client.requests == 3
    assert len(delays) == 2
    assert "/down" in str(info.value) and SECRET not in str(info.value)


def test_read_timeout_is_retried(api):
    api.queue("/sluggish", Reply(200, b"[]", delay=0.5), Reply.json([2]))
    delays: list[float] = []
    with make_client(delays, timeout=0.1) as client:
        assert client.get(api.url("/sluggish")).json() == [2]
        assert client.requests == 2
    assert len(delays) == 1


def test_404_raises_at_once(api):
    delays: list[float] = []
    with make_client(delays) as client:
        with pytest.raises(FetchError, match="404") as info:
            client.get(api.url("/missing"), params={"api_key": SECRET})
        assert client.requests == 1
    assert delays == []
    assert "/missing" in str(info.value) and SECRET not in str(info.value)


def test_401_names_credentials_but_not_their_value(api):
    api.queue("/private", Reply.json({"message": "Bad credentials"}, status=401))
    with make_client([]) as client:
        with pytest.raises(FetchError, match="401.*credentials") as info:
            client.get(api.url("/private"), headers={"Authorization": f"Bearer {SECRET}"})
    assert SECRET not in str(info.value)


def test_logs_never_show_query_strings(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.queue("/flaky", Reply.json({}, status=500), Reply.json([]))
    with make_client([]) as client:
        client.get(api.url("/flaky"), params={"api_key": SECRET})
    assert "/flaky" in caplog.text
    assert SECRET not in caplog.text
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("httpcore").level == logging.WARNING


def test_client_closes_its_own_pool_and_leaves_the_shared_one_open():
    # A client given a transport has a pool of its own; without one, the process's shared
    # pool (tests/sources/test_http_shared.py), which outlives it for the next sync's client.
    own = HttpClient(transport=httpx.HTTPTransport())
    with own:
        pass
    assert own._client.is_closed
    with HttpClient() as first:
        pass
    with HttpClient() as second:
        assert second._client is first._client and not second._client.is_closed


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("5", 5.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        ("soon", None),
        (formatdate(1_000.0, usegmt=True), 0.0),  # a date in the past: retry now
    ],
)
def test_retry_after_parsing(value, seconds):
    assert retry_after_seconds(value, now=2_000.0) == seconds
