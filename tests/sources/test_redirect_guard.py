"""Where a redirect may lead: never to a non-HTTP URL, never into a loopback, link-local or
private network the source's base_url is not in, unless the source allows it.

Every request goes to loopback servers: names are given addresses by the client's resolver
hook (what the guard sees), and the wire sends every connection to 127.0.0.1 whatever the
host, so a guard that failed would show as a request on the trap server, never as traffic
elsewhere.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

import httpx
import pytest
from changewatch.sources.errors import FetchError
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.ratelimit import RateLimits
from changewatch.sources.rest import RestSource, RestSourceConfig
from wireserver import WireServer, json_route, redirect_route

# What the guard is told each name resolves to (a hosts file for the test).
HOSTS = {
    "api.example.test": ["93.184.215.14"],  # a public address: the base is not internal
    "metadata.test": ["169.254.169.254"],
    "intranet.test": ["10.20.30.40"],
    "both.test": ["93.184.215.15", "fd12::7"],  # one private address is enough to refuse
}


def hosts(name: str) -> list[str]:
    """No DNS query leaves the test: an unknown name resolves to nothing."""
    if name == "localhost":
        return ["127.0.0.1", "::1"]
    if name in HOSTS:
        return HOSTS[name]
    try:
        return [str(ipaddress.ip_address(name))]
    except ValueError:
        return []


class ToLoopback(httpx.BaseTransport):
    """The wire: every connection goes to 127.0.0.1 at the URL's port (the Host header keeps
    the name), so nothing leaves this host whatever a redirect names."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(host="127.0.0.1")
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def rest_source(base_url: str, **settings: Any) -> RestSource:
    config = {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint"},
        "base_url": base_url,
        "path": "/items",
        **settings,
    }
    factory = functools.partial(
        HttpClient, sleep=[].append, resolver=hosts, transport=ToLoopback(), limits=RateLimits()
    )
    # The default policy retries 5 times: a refusal must not be retried.
    return RestSource(RestSourceConfig.model_validate(config), client_factory=factory)


@pytest.fixture
def servers():
    with WireServer() as api, WireServer() as trap:
        trap.routes["/items"] = json_route([{"id": 666}])
        yield api, trap


def at_port(port: int):
    return lambda host: f"http://{host}:{port}/items"


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("[::1]", "loopback"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("0.0.0.0", "loopback"),
        ("localhost", "loopback"),
        ("169.254.169.254", "link-local"),
        ("metadata.test", "link-local"),
        ("[fe80::1]", "link-local"),
        ("10.0.0.5", "private"),
        ("intranet.test", "private"),
        ("192.168.1.1", "private"),
        ("[fd00::1]", "private"),
        ("both.test", "private"),
    ],
)
def test_a_redirect_into_an_internal_network_is_refused(servers, host: str, kind: str) -> None:
    api, trap = servers
    port = trap.base_url.rsplit(":", 1)[1]
    api.routes["/items"] = redirect_route(lambda _r: f"http://{host}:{port}/items?page=1")
    source = rest_source(f"http://api.example.test:{api.base_url.rsplit(':', 1)[1]}")
    with pytest.raises(FetchError) as caught:
        source.fetch(cursor=None)
    message = str(caught.value)
    assert message.startswith("acme_items: GET api.example.test/items: ")
    assert f"redirect to a {kind} address refused (http://{host}:{port}/items)" in message
    assert "allow_private_redirects" in message
    assert "\n" not in message
    assert len(api.received) == 1  # one attempt, not retried
    assert trap.received == []  # nothing was sent where it was refused


def test_a_source_that_allows_it_follows_the_redirect(servers) -> None:
    api, trap = servers
    port = trap.base_url.rsplit(":", 1)[1]
    api.routes["/items"] = redirect_route(lambda _r: f"http://metadata.test:{port}/items")
    base = f"http://api.example.test:{api.base_url.rsplit(':', 1)[1]}"
    source = rest_source(base, allow_private_redirects=True)
    assert source.fetch(cursor=None).records() == [{"id": 666}]
    assert len(trap.received) == 1


def test_a_base_in_a_network_may_redirect_within_that_kind_only(servers) -> None:
    api, trap = servers
    trap_port = trap.base_url.rsplit(":", 1)[1]
    # base_url on loopback: another loopback port is where the source is.
    api.routes["/items"] = redirect_route(lambda _r: f"http://localhost:{trap_port}/items")
    assert rest_source(api.base_url).fetch(cursor=None).records() == [{"id": 666}]
    # ... but a link-local address is not.
    api.routes["/items"] = redirect_route(lambda _r: f"http://metadata.test:{trap_port}/items")
    with pytest.raises(FetchError, match=r"redirect to a link-local address refused"):
        rest_source(api.base_url).fetch(cursor=None)
    assert len(trap.received) == 1


def test_a_public_redirect_is_followed(servers) -> None:
    api, _trap = servers
    elsewhere_port = api.base_url.rsplit(":", 1)[1]
    api.routes["/items"] = redirect_route(
        lambda _r: f"http://both.test.example.invalid:{elsewhere_port}/v2"
    )
    api.routes["/v2"] = json_route([{"id": 1}])
    # An unknown name is not refused (the hook gives it no address; the wire still connects).
    base = f"http://api.example.test:{elsewhere_port}"
    assert rest_source(base).fetch(cursor=None).records() == [{"id": 1}]


@pytest.mark.parametrize(
    "location",
    ["file:///etc/passwd", "ftp://api.example.test/items", "gopher://127.0.0.1:70/"],
)
def test_a_redirect_to_a_non_http_url_is_refused_after_one_attempt(location: str) -> None:
    with WireServer() as api:
        api.routes["/items"] = redirect_route(lambda _r: location)
        delays: list[float] = []
        client = HttpClient(policy=HttpPolicy(), sleep=delays.append, limits=RateLimits())
        with client, pytest.raises(FetchError) as caught:
            client.get(api.url("/items"))
        assert "redirect to a non-HTTP URL refused" in str(caught.value)
        assert len(api.received) == 1
        assert delays == []
