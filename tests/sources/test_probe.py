"""Change probes against real loopback servers: 304s, body hashes, changes, errors, time bounds."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.feed import FeedSourceConfig
from changewatch.sources.github import GitHubSourceConfig
from changewatch.sources.probe import (
    DEFAULT_PROBE_BUDGET,
    SINCE_MARGIN,
    ProbeClients,
    probe,
    probe_all,
    probe_budget,
    probe_policy,
)
from changewatch.sources.rest import RestSourceConfig
from github_server import FakeGitHub

RSS = b"""<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>
<item><guid>a</guid><title>A</title></item></channel></rss>"""


@pytest.fixture
def clients() -> Iterator[ProbeClients]:
    with ProbeClients() as pool:
        yield pool


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def rest(base_url: str, path: str, **settings: Any) -> RestSourceConfig:
    return RestSourceConfig.model_validate(
        {
            "name": "items",
            "type": "rest",
            "table": "items",
            "primary_key": "id",
            "columns": {"id": "bigint"},
            "base_url": base_url,
            "path": path,
            **settings,
        }
    )


def feed(url: str, **settings: Any) -> FeedSourceConfig:
    return FeedSourceConfig.model_validate(
        {"name": "news", "type": "feed", "table": "news", "url": url, **settings}
    )


def test_feed_probe_sends_the_validators_it_saw_and_a_304_is_unchanged(api, clients):
    calls: list[dict[str, str]] = []

    def answer(request) -> Reply:
        calls.append(request.headers)
        if request.headers.get("if-none-match") == '"v1"':
            return Reply(304, b"", {"ETag": '"v1"'})
        return Reply(200, RSS, {"ETag": '"v1"', "Content-Type": "application/rss+xml"})

    api.route("/feed", answer)
    config = feed(api.url("/feed"))
    first = probe(config, None, clients)
    assert first.changed is True and first.error is None  # never probed: counts as changed
    assert first.state[""]["e"] == '"v1"'
    again = probe(config, first.state, clients)
    assert again.changed is False and again.state == first.state
    assert calls[1]["if-none-match"] == '"v1"'
    assert "application/rss+xml" in calls[1]["accept"]


def test_rest_probe_without_validators_compares_a_hash_of_the_first_page(api, clients):
    pages = {"1": [{"id": 1}, {"id": 2}], "2": [{"id": 3}]}
    api.route("/items", lambda r: Reply.json(pages.get(r.query["page"], [])))
    config = rest(api.base_url, "/items", paginator={"type": "page_number"})
    first = probe(config, None, clients)
    assert first.changed is True
    assert set(first.state[""]) == {"h"}  # no validators from this server: only the hash
    assert probe(config, first.state, clients).changed is False
    pages["1"] = [{"id": 1, "title": "edited"}, {"id": 2}]
    changed = probe(config, first.state, clients)
    assert changed.changed is True and changed.state != first.state
    # Only the first page is asked, as its sync's walk would ask it.
    assert [r.query for r in api.received] == [{"page": "1"}] * 3


def test_a_new_etag_over_the_same_body_is_no_change(api, clients):
    tags = iter(f'"{n}"' for n in range(10))
    api.route("/items", lambda _r: Reply(200, b"[]", {"ETag": next(tags)}))
    config = rest(api.base_url, "/items")
    first = probe(config, None, clients)
    again = probe(config, first.state, clients)
    assert again.changed is False
    assert again.state[""]["e"] == '"1"'  # the newest validator is kept for the next probe


def test_github_probe_asks_the_newest_issue_of_each_repository_and_304s_cost_no_budget(clients):
    with FakeGitHub() as github:
        github.add_issue("acme/a", 1, "2026-01-01T00:00:00Z")
        github.add_issue("acme/b", 1, "2026-01-01T00:00:00Z")
        config = GitHubSourceConfig.model_validate(
            {
                "name": "gh",
                "type": "github",
                "table": "gh",
                "repos": ["acme/a", "acme/b"],
                "base_url": github.base_url,
            }
        )
        first = probe(config, None, clients)
        assert first.changed is True and set(first.state) == {"acme/a", "acme/b"}
        spent = github.counters.ok
        unchanged = probe(config, first.state, clients)
        assert unchanged.changed is False
        assert github.counters.ok == spent and github.counters.not_modified == 2
        github.add_issue("acme/b", 2, "2026-01-02T00:00:00Z")
        changed = probe(config, unchanged.state, clients)
        assert changed.changed is True
        assert changed.state["acme/a"] == first.state["acme/a"]
        assert changed.state["acme/b"] != first.state["acme/b"]
        query = github.received[-1].query
        assert (query["sort"], query["direction"], query["per_page"]) == ("updated", "desc", "1")


def test_demo_api_probe_sees_a_changed_issue(clients):
    with DemoAPIServer(DemoTracker(issues=40, seed=3)) as server:
        config = rest(
            server.url,
            "/repos/acme/widgets/issues",
            params={"state": "all", "sort": "updated", "direction": "desc", "per_page": 100},
            paginator={"type": "link_header"},
        )
        first = probe(config, None, clients)
        assert probe(config, first.state, clients).changed is False
        server.tracker.mutate(update=1)
        assert probe(config, first.state, clients).changed is True


def test_an_error_keeps_the_state_and_names_the_source_without_stopping_others(api, clients):
    api.route("/ok", lambda _r: Reply.json([1]))
    api.route("/down", lambda _r: Reply.json({"message": "boom"}, status=503))
    ok, down = rest(api.base_url, "/ok"), rest(api.base_url, "/down", name="broken")
    known = {"": {"h": "0123456789abcdef"}}
    results = probe_all([down, ok], {"broken": known}, clients)
    assert results["broken"].changed is None
    assert results["broken"].state == known  # nothing learnt is lost
    assert "source 'broken'" in results["broken"].error and "503" in results["broken"].error
    assert results["items"].changed is True and results["items"].error is None
    # One attempt: a failed probe falls back to the interval sync, it does not retry.
    assert api.paths().count("/down") == 1


def test_unreachable_host_and_unset_credential_are_errors(clients, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        result = probe(rest(f"http://127.0.0.1:{port}", "/x"), None, clients)
    assert result.changed is None and f"127.0.0.1:{port}" in result.error
    monkeypatch.delenv("PROBE_TEST_TOKEN", raising=False)
    config = rest(
        "http://127.0.0.1:9", "/x", auth={"type": "bearer", "token_env": "PROBE_TEST_TOKEN"}
    )
    result = probe(config, None, clients)
    assert result.changed is None and "PROBE_TEST_TOKEN" in result.error


def test_a_server_that_never_answers_ends_the_probe_within_its_timeout(clients):
    with socket.socket() as sock:
        # Listening but never accepting: the connection opens, no byte ever comes back.
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        config = rest(f"http://127.0.0.1:{sock.getsockname()[1]}", "/x", probe={"timeout": 1})
        assert probe_policy(config).response_timeout == 1.0
        started = time.monotonic()
        result = probe(config, None, clients)
        took = time.monotonic() - started
    assert result.changed is None and result.error is not None
    # It waited for the answer, then gave up at its timeout (not the sync's 120 s default);
    # the margin only absorbs a loaded machine's scheduling.
    assert 1.0 <= took < 30.0, took


def test_probe_timeout_never_exceeds_the_sources_response_timeout():
    config = rest("http://127.0.0.1:9", "/x", response_timeout=2, probe={"timeout": 10})
    policy = probe_policy(config)
    assert (policy.timeout, policy.response_timeout, policy.max_retries) == (2.0, 2.0, 0)
    assert probe_policy(rest("http://127.0.0.1:9", "/x")).response_timeout == 10.0


def test_a_source_with_a_parent_listing_has_no_probe(api, clients):
    config = rest(
        api.base_url,
        "/posts/{parent.id}/comments",
        parent={"path": "/posts"},
        primary_key=["post_id", "id"],
        columns={"post_id": "bigint", "id": "bigint"},
    )
    result = probe(config, None, clients)
    assert (result.changed, result.error) == (None, None)
    assert api.received == []


def test_probes_past_the_tick_budget_are_errors_naming_it(api, clients):
    api.route("/ok", lambda _r: Reply.json([1]))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        hung = f"http://127.0.0.1:{sock.getsockname()[1]}"
        slow = [rest(hung, "/x", name=f"hung_{n}", probe={"timeout": 30}) for n in range(3)]
        ok = rest(api.base_url, "/ok")
        started = time.monotonic()
        # One at a time: the quick source first, then the hung ones queue behind each other.
        results = probe_all([ok, *slow], {}, clients, max_in_flight=1, budget=1.0)
        took = time.monotonic() - started
    assert results["items"].changed is True
    for n in range(3):
        error = results[f"hung_{n}"].error
        assert results[f"hung_{n}"].changed is None and error is not None
        assert "probe budget of 1 s" in error and "CHANGEWATCH_PROBE_BUDGET" in error
    # Back at the budget, not after three 30 s timeouts one after another (the margin only
    # absorbs a loaded machine's scheduling).
    assert took < 20.0, took


def test_probe_budget_comes_from_the_environment():
    assert probe_budget({}) == DEFAULT_PROBE_BUDGET == 40.0
    with pytest.raises(ValueError, match="CHANGEWATCH_PROBE_BUDGET='soon'"):
        probe_budget({"CHANGEWATCH_PROBE_BUDGET": "soon"})


def test_credentials_go_with_the_probe_and_nowhere_else(api, clients, monkeypatch):
    secret = "probe-key-9f8e7d6c"
    monkeypatch.setenv("PROBE_TEST_KEY", secret)
    api.queue("/items", Reply.json([1], ETag='"a"'), Reply.json({"m": 1}, status=500))
    config = rest(
        api.base_url, "/items", auth={"type": "query", "name": "key", "value_env": "PROBE_TEST_KEY"}
    )
    first = probe(config, None, clients)
    failed = probe(config, first.state, clients)
    assert [r.query.get("key") for r in api.received] == [secret, secret]
    assert failed.error is not None and "500" in failed.error
    assert secret not in repr(first) + repr(failed)  # not in errors, nor in the kept state


def test_an_incremental_probe_asks_since_its_last_answer_so_any_change_shows(api, clients):
    # Oldest first, two per page: a change lands on the last page, which a first-page probe
    # without `since` would never see.
    updated = {1: "2020-01-01T00:00:00Z", 2: "2020-01-02T00:00:00Z", 3: "2020-01-03T00:00:00Z"}

    def listing(request) -> Reply:
        since = request.query.get("since", "")
        rows = sorted(
            ({"id": n, "updated_at": at} for n, at in updated.items() if at >= since),
            key=lambda row: row["updated_at"],
        )
        return Reply.json(rows[:2])

    api.route("/items", listing)
    config = rest(
        api.base_url,
        "/items",
        sync="incremental",
        updated_at="updated_at",
        columns={"id": "bigint", "updated_at": "timestamp"},
        incremental={"param": "since"},
    )
    first = probe(config, None, clients)
    assert "since" in api.received[-1].query  # from our clock, the first time
    # The server's time of the answer (its Date header), less the margin.
    mark = datetime.fromisoformat(first.state[""]["s"])
    assert abs((datetime.now(UTC) - mark).total_seconds() - SINCE_MARGIN) < 120
    quiet = probe(config, first.state, clients)
    assert api.received[-1].query["since"] == first.state[""]["s"]
    assert quiet.changed is False
    updated[1] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # now the newest: last page
    assert probe(config, quiet.state, clients).changed is True
