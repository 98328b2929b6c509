"""Where a redirect leads, and what of the request may go there: credentials stay with the origin.

``HttpClient`` follows redirects itself (httpx would send custom auth headers such as
``X-Api-Key``, and query-string keys, to any host a ``Location`` names). Within one origin
(scheme, host and port) a redirect keeps the request as it was; once it leaves, every
credential is dropped for the rest of the chain: the source's auth headers and parameters,
any credential-like header or parameter, userinfo, and the conditional validators that
belonged to the first URL. Cookies are never kept (see ``HttpClient``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import httpx
from changewatch.sources.ratelimit import CREDENTIAL_HEADERS, CREDENTIAL_PARAMS

__all__ = ["Hop", "origin", "redirect"]

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
