"""Cheap change probes: did a source change upstream since the last probe, for one request?

Where it sits: beside the sources, before any sync. The sync sensor
(pipeline/polling/probe_decisions.py) probes each source at its interval and starts a sync run only
when the answer is "changed" (or unknown), so a poll that finds nothing costs one HTTP request, not
a run.

Each source type says which first-page requests tell its changes (``sources/<type>/probe.py``);
this module sends them with the source's own HTTP policy (``sources.http``: limits, redirect
rule, rate budgets, at most 4 requests in flight per host), conditionally with the validators
the last probe saw, and compares a hash of the body where the server gives no validators.
The probe's state is its own (a small JSON-able dict kept in the sensor's cursor), separate
from the validators a sync stores with its rows.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from changewatch.sources.base import SourceBase, Validator
from changewatch.sources.errors import RateLimited, SourceError
from changewatch.sources.http import HttpClient, HttpPolicy, validator_of
from changewatch.sources.ratelimit import RateLimits

__all__ = [
    "DEFAULT_PROBE_BUDGET",
    "MAX_PROBES_IN_FLIGHT",
    "PROBE_BUDGET_ENV",
    "ProbeClients",
    "ProbeRequest",
    "ProbeResult",
    "has_probe",
    "probe",
    "probe_all",
    "probe_budget",
    "probe_policy",
    "probe_requests",
]

# Probes run at once across all sources (each host still gets at most the HTTP policy's
# max_in_flight); the rest wait their turn in the pool.
MAX_PROBES_IN_FLIGHT = 16

# Seconds all probes of one sensor tick may take together: Dagster gives a sensor evaluation
# 60 s (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS); a probe not answered by then is reported as an
# error, so its source is synced at its interval as without probes. Env: PROBE_BUDGET_ENV.
DEFAULT_PROBE_BUDGET = 40.0
PROBE_BUDGET_ENV = "CHANGEWATCH_PROBE_BUDGET"

# How far before the server's time of its previous answer (its Date header) an incremental
# probe asks `since`: an update stamped a little before it was visible must not be missed
# (one seen twice is no change).
SINCE_MARGIN = 300.0

# State of one request: {"e": etag, "m": last-modified, "h": body hash, "s": since mark};
# short keys because it lives in the sensor cursor for every source.
RequestState = dict[str, str]
ProbeState = dict[str, RequestState]


@dataclass(frozen=True)
class ProbeRequest:
    """One GET that tells a source's changes: its first page (or a repository's newest issue).

    ``key`` names it in the probe state ("" for a source's only request). ``secrets`` are
    the headers and parameters carrying credentials (dropped on a cross-origin redirect).
    """

    key: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    # An incremental listing's `since` parameter: its name and how an ISO-8601 time is sent.
    # The probe then asks what changed since its previous probe (less SINCE_MARGIN), so a
    # change anywhere in the listing shows on the first page.
    since: tuple[str, Callable[[str], Any]] | None = None


@dataclass(frozen=True)
class ProbeResult:
    """What one probe found: ``changed`` True/False, or None when it could not tell.

    None comes with ``error`` (the request failed: the sensor falls back to the interval
    sync) or without it (the source has no probe). ``state`` is what the next probe sends
    back; on an error it is the state the probe was given, so nothing learnt is lost.
    ``retry_after``: seconds the server asked to wait (a 429's ``Retry-After``, a spent rate
    budget), which the adaptive envelope honours.
    """

    changed: bool | None
    state: ProbeState
    error: str | None = None
    retry_after: float | None = None


def probe_requests(config: SourceBase) -> list[ProbeRequest] | None:
    """The requests that tell ``config``'s changes, or None when its type has no probe.

    Raises ``SourceError`` when they cannot be built (a credential's variable is unset).
    """
    # Imported here: each type's probe imports this module for ProbeRequest.
    from changewatch.sources.feed.config import FeedSourceConfig
    from changewatch.sources.feed.probe import feed_probe_requests
    from changewatch.sources.fleet import fleet_probe_requests, is_fleet
    from changewatch.sources.github.config import GitHubSourceConfig
    from changewatch.sources.github.probe import github_probe_requests
    from changewatch.sources.rest.config import RestSourceConfig
    from changewatch.sources.rest.probe import rest_probe_requests

    if is_fleet(config):
        return fleet_probe_requests(config)  # each listed target's, keyed by target
    if isinstance(config, RestSourceConfig):
        return rest_probe_requests(config)
    if isinstance(config, FeedSourceConfig):
        return feed_probe_requests(config)
    if isinstance(config, GitHubSourceConfig):
        return github_probe_requests(config)
    return None


def probe_budget(environ: Mapping[str, str] | None = None) -> float:
    """Seconds one tick's probes may take: ``$CHANGEWATCH_PROBE_BUDGET`` or the default.

    >>> probe_budget({}), probe_budget({"CHANGEWATCH_PROBE_BUDGET": "20"})
    (40.0, 20.0)
    """
    text = (os.environ if environ is None else environ).get(PROBE_BUDGET_ENV, "").strip()
    if not text:
        return DEFAULT_PROBE_BUDGET
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 3600:
        raise ValueError(f"{PROBE_BUDGET_ENV}={text!r}: give seconds above 0 and below 3600")
    return value


def has_probe(config: SourceBase) -> bool:
    """Whether ``config``'s source type can be probed (without building any request)."""
    from changewatch.sources.feed.config import FeedSourceConfig
    from changewatch.sources.github.config import GitHubSourceConfig
    from changewatch.sources.rest.config import RestSourceConfig

    if isinstance(config, RestSourceConfig):
        return config.parent is None
    return isinstance(config, FeedSourceConfig | GitHubSourceConfig)


def probe_policy(config: SourceBase, base: HttpPolicy | None = None) -> HttpPolicy:
    """The source's HTTP policy, bounded for a probe: each request answered whole within
    ``probe.timeout`` (at most ``response_timeout``), no retries and no waiting for a rate
    budget, since a failed probe only means a sync at the interval, as without probes."""
    policy = (base or HttpPolicy()).bounded_by(config)
    limit = min(config.probe.timeout, policy.response_timeout)
    return replace(policy, timeout=limit, response_timeout=limit, max_retries=0, max_wait=0.0)


class ProbeClients:
    """HTTP clients kept across probes, one per HTTP policy (so per probe timeout and bounds).

    A long-lived sensor probes the same hosts every tick: reusing the connection pool saves
    the TCP (and TLS) setup that would cost more than the probe itself. ``transport`` and
    ``limits`` (a rate-limit registry of their own, not the process's) are for tests;
    thread-safe.
    """

    def __init__(self, *, transport: Any = None, limits: RateLimits | None = None) -> None:
        self._clients: dict[HttpPolicy, HttpClient] = {}
        self._lock = threading.Lock()
        self._transport = transport
        self._limits = limits
        # A sensor's clients live as long as its definition; when that goes, so do their
        # connections (closed, not left to the garbage collector's ResourceWarning).
        weakref.finalize(self, _close_all, self._clients)

    def client(self, policy: HttpPolicy) -> HttpClient:
        with self._lock:
            client = self._clients.get(policy)
            if client is None:
                client = HttpClient(
                    policy=policy, name="probe", transport=self._transport, limits=self._limits
                )
                self._clients[policy] = client
            return client

    def close(self) -> None:
        with self._lock:
            _close_all(self._clients)

    def __enter__(self) -> ProbeClients:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close_all(clients: dict[HttpPolicy, HttpClient]) -> None:
    for client in list(clients.values()):
        client.close()
    clients.clear()


def fingerprint(body: bytes) -> str:
    """A short hash of a body: enough to tell two versions of one page apart.

    >>> fingerprint(b"[]")
    '4f53cda18c2baa0c'
    """
    return hashlib.sha256(body).hexdigest()[:16]


def probe(config: SourceBase, state: ProbeState | None, clients: ProbeClients) -> ProbeResult:
    """Probe ``config``'s source once, given the ``state`` the last probe returned (None: never
    probed, which counts as changed). Never raises for a failed request: the error is in the
    result, naming the source."""
    known = state or {}
    try:
        requests = probe_requests(config)
        if requests is None:
            return ProbeResult(changed=None, state=known)
        client = clients.client(probe_policy(config))
        changed, found = False, {}
        for request in requests:
            was = known.get(request.key)
            now = _ask(client, request, was)
            found[request.key] = now
            changed = changed or not unchanged(was, now)
    except RateLimited as exc:
        wait = max(0.0, exc.retry_at - time.time())
        error = f"source {config.name!r}: {exc}"
        return ProbeResult(changed=None, state=known, error=error, retry_after=wait)
    except SourceError as exc:
        return ProbeResult(changed=None, state=known, error=f"source {config.name!r}: {exc}")
    return ProbeResult(changed=changed, state=found)


def _ask(client: HttpClient, request: ProbeRequest, was: RequestState | None) -> RequestState:
    """The state of one request now: validators, and the body's hash (kept from ``was`` on a
    304, which has no body)."""
    sent = Validator(etag=was.get("e"), last_modified=was.get("m")) if was else None
    params = dict(request.params)
    if request.since is not None:
        # The first probe asks since our own clock's mark, so that the next, asking since the
        # server's, compares a like window (the first counts as changed anyway).
        name, send = request.since
        params[name] = send(was["s"] if was and "s" in was else _iso(time.time() - SINCE_MARGIN))
    response = client.get(
        request.url,
        params=params or None,
        headers=request.headers,
        validator=sent if sent is not None and sent.sendable else None,
        secrets=request.secrets,
    )
    if response.status_code == 304 and was is not None:
        return was
    now: RequestState = {"h": fingerprint(response.content)}
    validator = validator_of(response)
    if validator is not None and validator.etag:
        now["e"] = validator.etag
    if validator is not None and validator.last_modified:
        now["m"] = validator.last_modified
    if request.since is not None:
        now["s"] = _mark(response)
    return now


def _mark(response: Any) -> str:
    """Where the next ``since`` probe starts: the server's time of this answer (its ``Date``
    header, else ours) less ``SINCE_MARGIN``, in ISO-8601 UTC."""
    try:
        moment = parsedate_to_datetime(response.headers["date"]).timestamp()
    except (KeyError, TypeError, ValueError):
        moment = time.time()
    return _iso(moment - SINCE_MARGIN)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unchanged(was: RequestState | None, now: RequestState) -> bool:
    """Whether two states of one request describe the same content: the body hash decides,
    so a server that sends a new ETag with the same body (per replica, per response) is no
    change.

    >>> unchanged({"h": "a", "e": "1"}, {"h": "a", "e": "2"}), unchanged(None, {"h": "a"})
    (True, False)
    """
    return was is not None and was.get("h") == now.get("h")


def probe_all(
    configs: Iterable[SourceBase],
    states: Mapping[str, ProbeState],
    clients: ProbeClients,
    *,
    max_in_flight: int = MAX_PROBES_IN_FLIGHT,
    budget: float = DEFAULT_PROBE_BUDGET,
    probe_one: Callable[[SourceBase, ProbeState | None, ProbeClients], ProbeResult] = probe,
) -> dict[str, ProbeResult]:
    """Probe every source in ``configs`` at once (by name), each from its state in ``states``.

    A probe that fails reports its error in its own result; the others go on. Probes still
    unanswered after ``budget`` seconds (a host that hangs, behind its 4 requests in flight)
    are reported as errors naming the budget, so the call returns in time for the sensor's
    tick; those still running end within their own timeout, unread.
    """
    configs = list(configs)
    if not configs:
        return {}
    pool = ThreadPoolExecutor(
        max_workers=min(max_in_flight, len(configs)), thread_name_prefix="probe"
    )
    try:
        futures = {c.name: pool.submit(probe_one, c, states.get(c.name), clients) for c in configs}
        wait(futures.values(), timeout=budget)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    results: dict[str, ProbeResult] = {}
    for name, future in futures.items():
        kept = dict(states.get(name) or {})
        if not future.done() or future.cancelled():
            results[name] = ProbeResult(
                changed=None,
                state=kept,
                error=(
                    f"source {name!r}: not probed within the tick's probe budget of {budget:g} s "
                    f"(set {PROBE_BUDGET_ENV} to change it)"
                ),
            )
            continue
        try:
            results[name] = future.result()
        except Exception as exc:  # a bug in one probe must not stop the others
            results[name] = ProbeResult(
                changed=None,
                state=kept,
                error=f"source {name!r}: probe failed: {type(exc).__name__}: {exc}",
            )
    return results
