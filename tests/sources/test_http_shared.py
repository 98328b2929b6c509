"""HttpClients of one process share one httpx client (sources/http.py ``_shared_client``):
a host's connection stays open from one sync's client to the next, and nothing of one
request (a cookie, a cut body, a redirect refused) reaches another's. Against a real loopback
server."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
from apiserver import Received
from changewatch.sources.errors import FetchError, LimitExceeded
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.ratelimit import RateLimits
from wireserver import WireServer, endless_route, redirect_route, send


def client(**policy: object) -> HttpClient:
    return HttpClient(policy=HttpPolicy(max_retries=0, **policy), limits=RateLimits())


def ports_route(ports: list[int], **headers: str):
    """200 with a small JSON body; records the client's port (one per TCP connection)."""

    def route(handler: BaseHTTPRequestHandler, _request: Received) -> None:
        ports.append(handler.client_address[1])
        send(handler, 200, b'{"ok": true}', **headers)

    return route


def test_clients_one_after_another_reuse_the_connection() -> None:
    ports: list[int] = []
    with WireServer() as api:
        api.routes["/items"] = ports_route(ports)
        for _ in range(3):  # three syncs, each with its client, closed after
            with client() as http:
                assert http.get(api.url("/items")).json() == {"ok": True}
                assert http.requests == 1
    assert len(ports) == 3 and len(set(ports)) == 1, ports


def test_a_cookie_never_reaches_another_client() -> None:
    ports: list[int] = []
    with WireServer() as api:
        api.routes["/login"] = ports_route(ports, Set_Cookie="session=s3cret; Path=/")
        api.routes["/items"] = ports_route(ports)
        with client() as first:
            first.get(api.url("/login"))
            first.get(api.url("/items"))
        with client() as second:
            second.get(api.url("/items"))
    assert [r.path for r in api.received] == ["/login", "/items", "/items"]
    assert all("cookie" not in r.headers for r in api.received)
    assert len(set(ports)) == 1  # over the same connection all the same


def test_a_body_cut_at_its_limit_leaves_the_next_client_a_clean_connection() -> None:
    ports: list[int] = []
    with WireServer() as api:
        api.routes["/endless"] = endless_route()
        api.routes["/items"] = ports_route(ports)
        with client(max_response_bytes=100_000) as http, pytest.raises(LimitExceeded):
            http.get(api.url("/endless"))
        with client() as http:
            assert http.get(api.url("/items")).json() == {"ok": True}
        with client() as http:
            assert http.get(api.url("/items")).json() == {"ok": True}
    assert len(ports) == 2 and len(set(ports)) == 1


def test_a_refused_redirect_is_refused_for_every_client() -> None:
    with WireServer() as api:
        # Out of loopback, into a private network the first URL is not in.
        api.routes["/items"] = redirect_route(lambda _request: "http://10.1.2.3/items")
        for _ in range(2):
            with client() as http, pytest.raises(FetchError, match="refused"):
                http.get(api.url("/items"))
    assert len(api.received) == 2
