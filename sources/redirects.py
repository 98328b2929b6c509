"""Where a redirect leads, and what of the request may go there: credentials stay with the origin.

``HttpClient`` follows redirects itself (httpx would send custom auth headers such as
``X-Api-Key``, and query-string keys, to any host a ``Location`` names). Within one origin
(scheme, host and port) a redirect keeps the request as it was; once it leaves, every
credential is dropped for the rest of the chain: the source's auth headers and parameters,
any credential-like header or parameter, userinfo, and the conditional validators that
belonged to the first URL. Cookies are never kept (see ``HttpClient``).

Where a redirect may lead is ``refusal``'s question: only to http(s), and not into a loopback,
link-local or private network (a cloud's metadata service at 169.254.169.254, another
service of this host) unless the chain started there itself or the source allows it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import httpx
from changewatch.sources.ratelimit import CREDENTIAL_HEADERS, CREDENTIAL_PARAMS

__all__ = ["Hop", "Resolver", "network_of", "origin", "redirect", "refusal", "resolve"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Validators describe the first URL's resource; sent elsewhere they only mislead.
_CONDITIONAL = frozenset({"if-none-match", "if-modified-since"})


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """``(scheme, host, port)``, the port filled in for http and https.

    >>> origin(httpx.URL("https://API.example.com:443/x"))
    ('https', 'api.example.com', 443)
    >>> origin(httpx.URL("http://127.0.0.1/"))
    ('http', '127.0.0.1', 80)
    """
    return url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)


@dataclass(frozen=True)
class Hop:
    """The next request of a redirect chain: its URL, the headers it carries, and whether the
    chain has left the first origin (so nothing secret is left in it)."""

    url: httpx.URL
    headers: dict[str, str]
    crossed: bool


def redirect(
    response: httpx.Response,
    headers: Mapping[str, str],
    secrets: Collection[str] = (),
    *,
    crossed: bool = False,
) -> Hop:
    """The request a redirect ``response`` (``has_redirect_location``) asks for next.

    ``headers`` were sent with the request that got ``response``; ``secrets`` name the
    headers and query parameters holding the source's credentials. ``crossed``: the chain
    left its first origin already (its headers hold no secret any more).
    """
    here = response.request.url
    target = here.join(response.headers["location"])
    if not crossed and origin(target) == origin(here):
        return Hop(target, dict(headers), crossed=False)
    secret = {name.lower() for name in secrets}
    dropped = secret | CREDENTIAL_HEADERS | _CONDITIONAL
    kept = {name: value for name, value in headers.items() if name.lower() not in dropped}
    # A Location that copies the request's query string would carry a query-string key along.
    for name in {name for name, _ in target.params.multi_items()}:
        if name.lower() in secret or name.lower() in CREDENTIAL_PARAMS:
            target = target.copy_remove_param(name)
    return Hop(target.copy_with(userinfo=b""), kept, crossed=True)


# A host name (or IP literal) to the addresses it connects to.
Resolver = Callable[[str], list[str]]


def resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to (itself for an IP literal); none when it does not."""
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []  # the request itself will say it cannot reach the host
    return [str(info[4][0]) for info in infos]


def network_of(address: str) -> str | None:
    """``"loopback"``, ``"link-local"`` or ``"private"`` for an address no public server
    holds; None for a public one.

    >>> [network_of(a) for a in ("127.0.0.2", "::1", "0.0.0.0", "169.254.169.254", "fe80::1")]
    ['loopback', 'loopback', 'loopback', 'link-local', 'link-local']
    >>> [network_of(a) for a in ("10.1.2.3", "fd00::1", "::ffff:192.168.0.1", "100.64.0.1")]
    ['private', 'private', 'private', 'private']
    >>> network_of("93.184.215.14") is None
    True
    """
    ip = ipaddress.ip_address(address.split("%")[0])  # an IPv6 zone ("fe80::1%eth0") aside
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return "loopback"  # 0.0.0.0 and :: connect to this host
    if ip.is_link_local:
        return "link-local"
    if not ip.is_global or ip.is_multicast:
        return "private"
    return None


def refusal(
    target: httpx.URL,
    start: httpx.URL,
    *,
    resolver: Resolver = resolve,
    allow_private: bool = False,
) -> str | None:
    """Why a redirect from a chain that began at ``start`` must not go to ``target``, or None.

    A non-HTTP scheme is always refused. A target in a loopback, link-local or private
    network is refused unless ``start`` is in that same kind of network (an API on this host
    may send the client to another of its ports, not to the metadata service) or
    ``allow_private``. Names are resolved with ``resolver``: one that resolves there counts.

    >>> refusal(httpx.URL("file:///etc/passwd"), httpx.URL("https://api.example.com/"))
    'redirect to a non-HTTP URL refused (file:///etc/passwd)'
    >>> refusal(httpx.URL("http://169.254.169.254/latest/"), httpx.URL("http://127.0.0.1:8/"))
    'redirect to a link-local address refused (http://169.254.169.254/latest/); ...'
    >>> refusal(httpx.URL("http://127.0.0.1:9/x"), httpx.URL("http://127.0.0.1:8/")) is None
    True
    """
    where = f"{target.scheme}://{target.netloc.decode('ascii', 'replace')}{target.path}"
    if target.scheme not in _DEFAULT_PORTS:
        return f"redirect to a non-HTTP URL refused ({where})"
    if allow_private or target.host == start.host:
        return None
    kinds = {network_of(address) for address in resolver(target.host)} - {None}
    if not kinds:
        return None
    home = {network_of(address) for address in resolver(start.host)}
    for kind in sorted(kinds - home):
        return (
            f"redirect to a {kind} address refused ({where}); set allow_private_redirects: true "
            "on the source if it should be followed"
        )
    return None
