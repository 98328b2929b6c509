"""The demo API over real HTTP on loopback: data, paging, filters, mutations and stats."""

from __future__ import annotations

import doctest
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import changewatch.sources.demo.tracker as tracker_module
import httpx
import orjson
import pytest
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.demo.tracker import LABELS

ISSUES = "/repos/acme/widgets/issues"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
KEYS = [
    "id", "number", "title", "body", "state", "labels", "assignee", "user", "comments",
    "created_at", "updated_at", "closed_at", "html_url",
]  # fmt: skip


@pytest.fixture
def server() -> Iterator[DemoAPIServer]:
    """A fresh server per test: mutations must not leak between tests."""
    with DemoAPIServer(DemoTracker(issues=250, seed=7)) as running:
        yield running


@pytest.fixture
def client(server: DemoAPIServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


def walk(client: httpx.Client, url: str, **params: object) -> list[dict]:
    """Every issue of a listing, following ``rel="next"`` links."""
    issues: list[dict] = []
    response = client.get(url, params=params)
    while True:
        response.raise_for_status()
        issues.extend(response.json())
        next_link = response.links.get("next")
        if next_link is None:
            return issues
        response = client.get(next_link["url"])


def without_updated_at(issue: dict) -> dict:
    return {key: value for key, value in issue.items() if key != "updated_at"}


# -- the data model ------------------------------------------------------------------------


def test_doctests() -> None:
    result = doctest.testmod(tracker_module)
    assert result.attempted > 0 and result.failed == 0


def test_same_seed_gives_identical_bytes() -> None:
    first, second = DemoTracker(issues=300, seed=3), DemoTracker(issues=300, seed=3)
    assert first.dumps() == second.dumps()
    assert DemoTracker(issues=300, seed=4).dumps() != first.dumps()
    # The same sequence of mutations also gives the same results and data.
    for tracker in (first, second):
        tracker.mutate(create=2, update=5, delete=3)
    assert first.mutate(update=4, delete=1) == second.mutate(update=4, delete=1)
    assert first.dumps() == second.dumps()
    assert first.clock == second.clock


def test_record_shape() -> None:
    tracker = DemoTracker(issues=400, seed=1)
    issues = tracker.snapshot()
    assert [issue["number"] for issue in issues] == list(range(1, 401))
    states = {issue["state"] for issue in issues}
    assert states == {"open", "closed"}
    for issue in issues:
        assert list(issue) == KEYS
        number = issue["number"]
        assert issue["id"] == 1_000_000 + number
        assert issue["html_url"] == f"https://demo.changewatch.local/acme/widgets/issues/{number}"
        assert isinstance(issue["title"], str) and issue["title"]
        assert issue["body"] is None or isinstance(issue["body"], str)
        assert all(set(label) == {"name"} and label["name"] in LABELS for label in issue["labels"])
        assert issue["assignee"] is None or set(issue["assignee"]) == {"login"}
        assert isinstance(issue["user"]["login"], str)
        assert isinstance(issue["comments"], int) and issue["comments"] >= 0
        assert STAMP.match(issue["created_at"]) and STAMP.match(issue["updated_at"])
        assert issue["created_at"] <= issue["updated_at"]
        assert (issue["state"] == "closed") == (issue["closed_at"] is not None)
        assert issue["closed_at"] is None or STAMP.match(issue["closed_at"])
    assert issues[0]["created_at"] == "2026-01-01T00:00:00Z"
    assert max(issue["updated_at"] for issue in issues) <= tracker.clock.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def test_custom_start_and_repo() -> None:
    tracker = DemoTracker(issues=2, start=datetime(2030, 5, 1, 12, tzinfo=UTC), repo="o/r")
    first = tracker.snapshot()[0]
    assert first["created_at"] == "2030-05-01T12:00:00Z"
    assert first["html_url"] == "https://demo.changewatch.local/o/r/issues/1"
    with pytest.raises(ValueError):
        DemoTracker(repo="no-slash")


def test_mutate_semantics() -> None:
    tracker = DemoTracker(issues=100, seed=2)
    before = {issue["number"]: issue for issue in tracker.snapshot()}
    latest = max(issue["updated_at"] for issue in before.values())
    result = tracker.mutate(create=3, update=10, delete=5)
    assert result["created"] == [101, 102, 103]
    assert len(result["updated"]) == 10 and len(result["deleted"]) == 5
    assert not set(result["updated"]) & set(result["deleted"])
    after = {issue["number"]: issue for issue in tracker.snapshot()}
    assert len(tracker) == 98
    assert set(after) == set(before) - set(result["deleted"]) | set(result["created"])
    touched = result["updated"] + result["created"]
    stamps = [after[number]["updated_at"] for number in touched]
    assert all(stamp > latest for stamp in stamps)
    assert len(set(stamps)) == len(stamps)  # one clock tick per touched issue
    for number in result["updated"]:
        assert without_updated_at(after[number]) != without_updated_at(before[number])
        assert after[number]["comments"] == before[number]["comments"] + 1
        assert (after[number]["state"] == "closed") == (after[number]["closed_at"] is not None)
    for number in set(after) - set(touched):
        assert after[number] == before[number]
    for number in result["created"]:
        assert after[number]["created_at"] == after[number]["updated_at"] > latest
        assert after[number]["state"] == "open"


def test_mutate_rejects_impossible_requests() -> None:
    tracker = DemoTracker(issues=5)
    with pytest.raises(ValueError):
        tracker.mutate(update=3, delete=3)
    with pytest.raises(ValueError):
        tracker.mutate(create=-1)
    assert len(tracker) == 5
    empty = tracker.clock
    assert tracker.mutate() == {"created": [], "updated": [], "deleted": []}
    assert tracker.clock > empty  # every call moves the logical clock


def test_large_tracker_builds_quickly() -> None:
    started = time.perf_counter()
    tracker = DemoTracker(issues=100_000, seed=1)
    assert time.perf_counter() - started < 10
    assert len(tracker) == 100_000
    page = tracker.page(state="all", per_page=100, page=1000, direction="asc")
    assert page.count == 100 and page.total == 100_000
    assert orjson.loads(page.body)[-1]["number"] == 100_000


# -- HTTP ----------------------------------------------------------------------------------


def test_http_serves_identical_bytes_for_the_same_seed() -> None:
    bodies = []
    for _ in range(2):
        with (
            DemoAPIServer(DemoTracker(issues=80, seed=11)) as server,
            httpx.Client(base_url=server.url) as http,
        ):
            response = http.get(ISSUES, params={"state": "all", "per_page": 100})
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/json"
            bodies.append(response.content)
    assert bodies[0] == bodies[1]
    assert len(orjson.loads(bodies[0])) == 80


def test_pagination_walk_returns_every_issue_once(
    server: DemoAPIServer, client: httpx.Client
) -> None:
    issues = walk(client, ISSUES, state="all", per_page=100)
    numbers = [issue["number"] for issue in issues]
    assert sorted(numbers) == list(range(1, 251))
    assert numbers == sorted(numbers, reverse=True)  # created, newest first by default
    assert issues == sorted(server.tracker.snapshot(), key=lambda i: -i["number"])


def test_link_header_matches_github_format(server: DemoAPIServer, client: httpx.Client) -> None:
    base = f"{server.url}{ISSUES}?state=all&per_page=100"
    first = client.get(ISSUES, params={"state": "all", "per_page": 100})
    assert first.headers["link"] == (f'<{base}&page=2>; rel="next", <{base}&page=3>; rel="last"')
    middle = client.get(ISSUES, params={"state": "all", "per_page": 100, "page": 2})
    assert middle.headers["link"] == (
        f'<{base}&page=1>; rel="prev", <{base}&page=3>; rel="next", '
        f'<{base}&page=3>; rel="last", <{base}&page=1>; rel="first"'
    )
    last = client.get(ISSUES, params={"state": "all", "per_page": 100, "page": 3})
    assert len(last.json()) == 50
    assert last.headers["link"] == f'<{base}&page=2>; rel="prev", <{base}&page=1>; rel="first"'
    beyond = client.get(ISSUES, params={"state": "all", "per_page": 100, "page": 9})
    assert beyond.status_code == 200 and beyond.json() == []
    # Everything on one page: no Link header at all, like GitHub.
    single = client.get(ISSUES, params={"state": "all", "per_page": 100, "since": "2999-01-01"})
    assert single.json() == [] and "link" not in single.headers


def test_link_keeps_other_params_and_page_position(
    server: DemoAPIServer, client: httpx.Client
) -> None:
    since = "2026-01-01T00:00:00Z"
    response = client.get(
        ISSUES, params={"page": 1, "sort": "updated", "per_page": 50, "since": since}
    )
    next_url = response.links["next"]["url"]
    assert next_url == (f"{server.url}{ISSUES}?sort=updated&per_page=50&since={since}&page=2")


def test_defaults_are_open_created_desc_30(server: DemoAPIServer, client: httpx.Client) -> None:
    issues = client.get(ISSUES).json()
    assert len(issues) == 30
    assert all(issue["state"] == "open" for issue in issues)
    open_numbers = [i["number"] for i in server.tracker.snapshot() if i["state"] == "open"]
    assert [issue["number"] for issue in issues] == sorted(open_numbers, reverse=True)[:30]


def test_per_page_is_capped_at_100(client: httpx.Client) -> None:
    response = client.get(ISSUES, params={"state": "all", "per_page": 500})
    assert len(response.json()) == 100
    assert 'page=3>; rel="last"' in response.headers["link"]


def test_state_filter(server: DemoAPIServer, client: httpx.Client) -> None:
    opened = walk(client, ISSUES, state="open", per_page=100)
    closed = walk(client, ISSUES, state="closed", per_page=100)
    assert opened and closed
    assert {issue["state"] for issue in opened} == {"open"}
    assert {issue["state"] for issue in closed} == {"closed"}
    assert len(opened) + len(closed) == 250


def test_since_filter(server: DemoAPIServer, client: httpx.Client) -> None:
    everything = server.tracker.snapshot()
    since = sorted(issue["updated_at"] for issue in everything)[100]
    expected = {issue["number"] for issue in everything if issue["updated_at"] >= since}
    got = walk(client, ISSUES, state="all", since=since, per_page=40)
    assert {issue["number"] for issue in got} == expected
    assert len(got) == len(expected) >= 150
    # Other spellings of the same moment select the same issues.
    moment = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    offset = walk(client, ISSUES, state="all", since=moment.isoformat(), per_page=100)
    assert {issue["number"] for issue in offset} == expected


def test_sort_and_direction(client: httpx.Client) -> None:
    by_updated = walk(client, ISSUES, state="all", sort="updated", direction="asc", per_page=100)
    keys = [(issue["updated_at"], issue["number"]) for issue in by_updated]
    assert keys == sorted(keys) and len(keys) == 250
    newest = walk(client, ISSUES, state="all", sort="updated", per_page=100)
    assert newest == by_updated[::-1]
    by_created = walk(client, ISSUES, state="all", direction="asc", per_page=100)
    assert [issue["number"] for issue in by_created] == list(range(1, 251))
    created = [issue["created_at"] for issue in by_created]
    assert created == sorted(created)


@pytest.mark.parametrize(
    "params",
    [
        {"state": "bogus"},
        {"sort": "comments_count"},
        {"direction": "up"},
        {"since": "yesterday"},
        {"per_page": "0"},
        {"per_page": "ten"},
        {"page": "-1"},
    ],
)
def test_bad_params_get_422(client: httpx.Client, params: dict[str, str]) -> None:
    response = client.get(ISSUES, params=params)
    assert response.status_code == 422
    body = response.json()
    assert body["message"] == "Validation Failed"
    assert body["errors"][0]["field"] == next(iter(params))


def test_single_issue(server: DemoAPIServer, client: httpx.Client) -> None:
    response = client.get(f"{ISSUES}/42")
    assert response.status_code == 200
    assert response.json() == server.tracker.get(42)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/repos/acme/gadgets/issues"),
        ("GET", "/repos/other/widgets/issues/1"),
        ("GET", f"{ISSUES}/9999"),
        ("GET", f"{ISSUES}/abc"),
        ("GET", f"{ISSUES}/0"),
        ("GET", "/"),
        ("GET", "/repos/acme/widgets"),
        ("GET", "/_demo/unknown"),
        ("POST", ISSUES),
        ("DELETE", f"{ISSUES}/1"),
    ],
)
def test_not_found(client: httpx.Client, method: str, path: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 404
    assert response.json() == {"message": "Not Found"}
    assert response.headers["content-type"] == "application/json"


def test_mutate_over_http(server: DemoAPIServer, client: httpx.Client) -> None:
    before = {issue["number"]: issue for issue in walk(client, ISSUES, state="all", per_page=100)}
    old_clock = server.tracker.clock
    clock = old_clock.strftime("%Y-%m-%dT%H:%M:%SZ")
    response = client.post("/_demo/mutate", json={"create": 3, "update": 7, "delete": 4})
    assert response.status_code == 200
    result = response.json()
    assert result["created"] == [251, 252, 253]
    assert len(result["updated"]) == 7 and len(result["deleted"]) == 4

    after = {issue["number"]: issue for issue in walk(client, ISSUES, state="all", per_page=100)}
    assert set(after) == set(before) - set(result["deleted"]) | set(result["created"])
    for number in result["deleted"]:
        assert client.get(f"{ISSUES}/{number}").status_code == 404
    for number in result["updated"]:
        assert after[number]["updated_at"] > clock
        assert without_updated_at(after[number]) != without_updated_at(before[number])
    # An incremental sync from just after the old clock sees exactly the updates and creations
    # (since is inclusive, and an old issue may have been updated exactly at the old clock).
    after_clock = (old_clock + timedelta(seconds=1)).isoformat()
    changed = walk(client, ISSUES, state="all", since=after_clock, per_page=100)
    assert sorted(issue["number"] for issue in changed) == sorted(
        result["updated"] + result["created"]
    )


@pytest.mark.parametrize(
    "body",
    [b'{"update": 200, "delete": 100}', b'{"create": -1}', b'{"explode": 1}', b"not json", b"[]"],
)
def test_mutate_rejects_bad_requests(
    server: DemoAPIServer, client: httpx.Client, body: bytes
) -> None:
    response = client.post("/_demo/mutate", content=body)
    assert response.status_code == 422
    assert "message" in response.json()
    assert len(server.tracker) == 250


def test_stats_count_requests(server: DemoAPIServer, client: httpx.Client) -> None:
    client.get(ISSUES)
    assert client.get("/_demo/stats").json()["requests"] == 1
    assert client.post("/_demo/reset-stats").json()["requests"] == 0
    for page in (1, 2, 3):
        client.get(ISSUES, params={"page": page})
    client.get(f"{ISSUES}/1")
    client.get("/nowhere")
    client.post("/_demo/mutate", json={"create": 1})
    stats = client.get("/_demo/stats").json()
    assert stats == {
        "requests": 5,  # control endpoints under /_demo/ are not counted
        "by_path": {ISSUES: 3, f"{ISSUES}/1": 1, "/nowhere": 1},
        "issues": 251,
    }
    assert server.stats() == stats


def test_keep_alive_pulls_many_pages_quickly() -> None:
    with (
        DemoAPIServer(DemoTracker(issues=20_000, seed=5)) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        started = time.perf_counter()
        issues = walk(http, ISSUES, state="all", per_page=100)
        elapsed = time.perf_counter() - started
        assert len(issues) == 20_000
        assert len({issue["number"] for issue in issues}) == 20_000
        assert server.stats()["requests"] == 200
        assert elapsed < 10  # ~0.2 s on loopback; generous for slow CI machines


def test_readers_see_consistent_pages_during_mutations(server: DemoAPIServer) -> None:
    failures: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with httpx.Client(base_url=server.url) as http:
            while not stop.is_set():
                response = http.get(ISSUES, params={"state": "all", "per_page": 100})
                issues = response.json()
                if response.status_code != 200 or len(issues) != 100:
                    failures.append(f"{response.status_code}: {len(issues)} issues")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    try:
        with httpx.Client(base_url=server.url) as http:
            for _ in range(30):
                response = http.post("/_demo/mutate", json={"create": 2, "update": 3, "delete": 2})
                assert response.status_code == 200
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert not failures
    assert len(server.tracker) == 250


def test_stop_closes_the_socket_and_keep_alive_connections() -> None:
    server = DemoAPIServer(DemoTracker(issues=3)).start()
    url = server.url
    with httpx.Client(base_url=url) as http:
        assert http.get(ISSUES).status_code == 200  # leaves a keep-alive connection open
        server.stop()
        with pytest.raises(httpx.TransportError):
            http.get(ISSUES)
    with pytest.raises(RuntimeError):
        _ = server.url
    server.stop()  # stopping twice is harmless
