"""Rate budgets, secondary limits, 304s and in-flight bounds of HttpClient, on the wire.

Clients and the fake GitHub share a ``Clock``: a client's sleeps move it, nothing waits for
real. Each test gets its own ``RateLimits`` registry (the process-wide one is the default).
"""

from __future__ import annotations

import random
import threading
import time
from email.utils import formatdate

import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.base import Validator
from changewatch.sources.errors import RateLimited
from changewatch.sources.http import HttpClient, HttpPolicy, validator_of
from changewatch.sources.ratelimit import RateLimits, credential_id
from github_server import Clock, FakeGitHub

TOKEN_A = "ghp_tokenAAAAAAAAAAAA"
TOKEN_B = "ghp_tokenBBBBBBBBBBBB"
ISSUES = "/repos/acme/widgets/issues"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limits() -> RateLimits:
    return RateLimits()


def make_client(clock: Clock, limits: RateLimits, **policy: float) -> HttpClient:
    return HttpClient(
        policy=HttpPolicy(**policy),
        now=clock.now,
        sleep=clock.sleep,
        rng=random.Random(1),
        limits=limits,
    )


def github(clock: Clock, **options: float) -> FakeGitHub:
    server = FakeGitHub(clock, **options)
    server.add_issue("acme/widgets", 1, "2024-01-01T00:00:00Z")
    return server


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- primary budget ---------------------------------------------------------------------------


def test_a_spent_budget_waits_for_a_near_reset_and_sends_nothing_before(clock, limits):
    with github(clock, limit=2, window=30) as api, make_client(clock, limits) as client:
        url = api.base_url + ISSUES
        assert client.get(url).headers["x-ratelimit-remaining"] == "1"
        assert client.get(url).headers["x-ratelimit-remaining"] == "0"
        reset = api.reset_at()
        assert clock.now() < reset
        response = client.get(url)  # the client knows the budget is spent: it waits first
        assert response.status_code == 200
    assert clock.slept == [pytest.approx(reset - api.received[1].at)]
    assert api.received[2].at >= reset
    assert api.counters.limited == 0  # never had to be told with a 403


def test_a_spent_budget_with_a_far_reset_defers_without_a_request(clock, limits):
    with github(clock, limit=1, window=3600) as api, make_client(clock, limits) as client:
        client.get(api.base_url + ISSUES)
        with pytest.raises(RateLimited, match="deferred") as info:
            client.get(api.base_url + ISSUES)
        assert client.requests == 1
    assert info.value.retry_at == api.reset_at()
    assert len(api.received) == 1
    assert clock.slept == []


def test_a_primary_403_waits_until_reset_when_short(clock, limits):
    with github(clock, window=45) as api, make_client(clock, limits) as client:
        api.exhaust()
        reset = api.reset_at()
        assert client.get(api.base_url + ISSUES).status_code == 200
        assert client.requests == 2
    assert clock.slept == [pytest.approx(45.0)]
    assert [r.at >= reset for r in api.received] == [False, True]
    assert api.counters.limited == 1


def test_a_primary_403_defers_when_reset_is_far(clock, limits):
    with github(clock, window=3600) as api, make_client(clock, limits) as client:
        api.exhaust(TOKEN_A)
        with pytest.raises(RateLimited) as info:
            client.get(api.base_url + ISSUES, headers=auth(TOKEN_A))
        assert client.requests == 1
    assert info.value.retry_at == api.reset_at(TOKEN_A)
    assert clock.slept == []
    assert TOKEN_A not in str(info.value)


def test_ietf_draft_headers_are_delta_seconds(clock, limits):
    with ApiServer() as api, make_client(clock, limits) as client:
        api.queue("/x", Reply.json([], RateLimit_Remaining="0", RateLimit_Reset="20"))
        api.queue("/x", Reply.json([]))
        client.get(api.url("/x"))
        client.get(api.url("/x"))
    assert clock.slept == [20.0]


# --- secondary limits and Retry-After ---------------------------------------------------------


def test_secondary_limit_without_headers_waits_60s_then_doubles(clock, limits):
    with github(clock) as api, make_client(clock, limits, max_wait=600) as client:
        api.secondary_limit(times=3)
        assert client.get(api.base_url + ISSUES).status_code == 200
        assert client.requests == 4
    assert clock.slept == [60.0, 120.0, 240.0]
    times = [r.at for r in api.received]
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [60.0, 120.0, 240.0]


def test_secondary_limit_beyond_max_wait_defers(clock, limits):
    with github(clock) as api, make_client(clock, limits) as client:  # max_wait 60 s
        api.secondary_limit(times=5)
        start = clock.now()
        with pytest.raises(RateLimited, match="deferred") as info:
            client.get(api.base_url + ISSUES)
        assert client.requests == 2
    assert clock.slept == [60.0]
    assert info.value.retry_at == start + 60 + 120


def test_a_success_resets_the_secondary_backoff(clock, limits):
    with github(clock) as api, make_client(clock, limits) as client:
        for _ in range(3):
            api.secondary_limit()
            client.get(api.base_url + ISSUES)
    assert clock.slept == [60.0, 60.0, 60.0]


def test_retry_after_a_day_defers_at_once_sleeping_nothing(clock, limits):
    with github(clock) as api, make_client(clock, limits) as client:
        api.retry_after("86400")
        started = time.monotonic()
        with pytest.raises(RateLimited, match="deferred") as info:
            client.get(api.base_url + ISSUES)
        assert time.monotonic() - started < 5
        assert client.requests == 1
    assert clock.slept == []
    assert info.value.retry_at == clock.now() + 86400


def test_retry_after_as_http_date(clock, limits):
    with github(clock) as api, make_client(clock, limits) as client:
        api.retry_after(formatdate(clock.now() + 30, usegmt=True), status=403)
        assert client.get(api.base_url + ISSUES).status_code == 200
    assert clock.slept == [30.0]
    assert api.received[1].at == api.received[0].at + 30


def test_retry_after_blocks_other_requests_of_the_same_budget(clock, limits):
    with github(clock) as api, make_client(clock, limits, max_wait=120) as client:
        api.retry_after("90", status=429)
        client.get(api.base_url + ISSUES)
        first = clock.now()
        # The budget is known open again: the next request goes at once.
        client.get(api.base_url + ISSUES)
    assert clock.slept == [90.0]
    assert api.received[-1].at == first


# --- keys: host and credential ----------------------------------------------------------------


def test_budgets_are_per_credential(clock, limits):
    with github(clock, limit=1) as api, make_client(clock, limits) as client:
        client.get(api.base_url + ISSUES, headers=auth(TOKEN_A))
        with pytest.raises(RateLimited) as info:
            client.get(api.base_url + ISSUES, headers=auth(TOKEN_A))
        assert client.get(api.base_url + ISSUES, headers=auth(TOKEN_B)).status_code == 200
        assert client.get(api.base_url + ISSUES).status_code == 200  # anonymous: its own
    assert api.counters.spent == {TOKEN_A: 1, TOKEN_B: 1, "": 1}
    assert TOKEN_A not in str(info.value)
    host = api.base_url.removeprefix("http://")
    assert limits.budget((host, credential_id([f"Bearer {TOKEN_A}"]))).remaining == 0
    assert limits.budget((host, credential_id([f"Bearer {TOKEN_B}"]))).remaining == 0
    assert TOKEN_A not in repr(limits._budgets) and TOKEN_B not in repr(limits._budgets)


def test_budgets_are_per_host(clock, limits):
    with (
        github(clock, limit=1) as one,
        github(clock, limit=1) as two,
        make_client(clock, limits) as client,
    ):
        client.get(one.base_url + ISSUES, headers=auth(TOKEN_A))
        with pytest.raises(RateLimited):
            client.get(one.base_url + ISSUES, headers=auth(TOKEN_A))
        assert client.get(two.base_url + ISSUES, headers=auth(TOKEN_A)).status_code == 200


# --- conditional requests ---------------------------------------------------------------------


def test_304s_spend_no_budget_on_github(clock, limits):
    with github(clock, limit=3) as api, make_client(clock, limits) as client:
        first = client.get(api.base_url + ISSUES)
        validator = validator_of(first)
        assert validator is not None and validator.etag
        for _ in range(5):
            again = client.get(api.base_url + ISSUES, validator=validator)
            assert again.status_code == 304
            assert again.headers["x-ratelimit-remaining"] == "2"
        assert api.received[-1].headers["if-none-match"] == validator.etag
    assert api.counters.spent == {"": 1}
    assert api.counters.not_modified == 5
    assert api.remaining() == 2
    assert limits.budget((api.base_url.removeprefix("http://"), "")).remaining == 2


def test_304s_spend_no_budget_in_our_own_accounting(clock, limits):
    # The server tells the budget once; after that only our own accounting knows it.
    validator = Validator(etag='"v1"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT")
    with ApiServer() as api, make_client(clock, limits) as client:
        reset = str(int(clock.now() + 3600))
        api.queue("/x", Reply.json([], X_RateLimit_Remaining="1", X_RateLimit_Reset=reset))
        api.queue("/x", *[Reply(304, b"", {"ETag": '"v1"'}) for _ in range(5)])
        api.queue("/x", Reply.json([]))
        client.get(api.url("/x"))
        for _ in range(5):
            response = client.get(api.url("/x"), validator=validator)
            assert response.status_code == 304
            assert validator_of(response, validator) == validator
        client.get(api.url("/x"))  # a 200: the last unit of the budget
        with pytest.raises(RateLimited):
            client.get(api.url("/x"))
    assert api.received[1].headers["if-none-match"] == '"v1"'
    assert api.received[1].headers["if-modified-since"] == validator.last_modified
    assert len(api.received) == 7


# --- in flight --------------------------------------------------------------------------------


def _hammer(api: FakeGitHub, limits: RateLimits, clock: Clock, threads: int, **policy) -> None:
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with make_client(clock, limits, **policy) as client:
                barrier.wait()
                client.get(api.base_url + ISSUES)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []


def test_requests_in_flight_per_host_are_bounded(clock, limits):
    with github(clock) as api:
        api.delay = 0.15
        _hammer(api, limits, clock, threads=8)
        assert api.counters.ok == 8
        assert 2 <= api.max_in_flight <= 4


def test_the_bound_is_what_holds_them_back(clock, limits):
    with github(clock) as api:
        api.delay = 0.3
        _hammer(api, limits, clock, threads=8, max_in_flight=8)
        assert api.max_in_flight > 4
