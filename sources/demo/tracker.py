"""A deterministic, in-memory, GitHub-like issue tracker: the data behind the demo API."""

from __future__ import annotations

import functools
import gc
import math
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

State = Literal["open", "closed", "all"]
Sort = Literal["created", "updated"]
Direction = Literal["asc", "desc"]

DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
HTML_ROOT = "https://demo.changewatch.local"
LABELS = ("bug", "enhancement", "docs", "security", "question")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
TICK = 60  # seconds the logical clock advances per mutated issue

_VERBS = ("Fix", "Improve", "Document", "Refactor", "Investigate", "Speed up", "Test", "Remove")
_SUBJECTS = (
    "the CSV exporter",
    "login redirects",
    "rate limiting",
    "the search index",
    "webhook retries",
    "pagination",
    "the settings page",
    "timezone handling",
    "the CLI installer",
    "dark mode",
    "memory usage",
    "the REST client",
    "email digests",
    "audit logging",
    "the sync scheduler",
)
_QUALIFIERS = (
    "",
    "",
    "",
    " on Windows",
    " for large repos",
    " after upgrade",
    " in the dashboard",
    " when the config is empty",
    " under load",
    " with unicode names",
)
_BODIES = (
    "Steps to reproduce are in the attached log.",
    "This started after the last release.",
    "We should decide on the expected behaviour first.",
    "Happens roughly once a day in production.",
    "A small patch is ready if the approach looks right.",
    "See the discussion in the weekly sync notes.",
)
_VIEW_CACHE_SIZE = 16  # filtered/sorted orders kept per data version (a pagination walk reuses one)


def format_ts(epoch: int) -> str:
    """GitHub's timestamp format for whole seconds since the epoch (UTC).

    >>> format_ts(1767225600)
    '2026-01-01T00:00:00Z'
    """
    # strftime costs ~2 us a call; the date part is shared by many stamps, so cache it.
    day, seconds = divmod(epoch, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"{_day_prefix(day)}{hours:02d}:{minutes:02d}:{seconds:02d}Z"


@functools.lru_cache(maxsize=4096)
def _day_prefix(day: int) -> str:
    return time.strftime("%Y-%m-%dT", time.gmtime(day * 86400))


def parse_ts(value: str | datetime) -> int:
    """Seconds since the epoch for an ISO 8601 timestamp; naive values are taken as UTC.

    Fractions round up, so ``updated >= parse_ts(since)`` matches ``updated >= since``.

    >>> parse_ts("2026-01-01T00:00:00Z"), parse_ts("2026-01-01T01:00:00+01:00")
    (1767225600, 1767225600)
    >>> parse_ts("2026-01-01T00:00:00.5Z")
    1767225601
    """
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return math.ceil(moment.timestamp())


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing: the JSON array body and the size of the whole listing."""

    body: bytes
    count: int  # issues on this page
    total: int  # issues matching the query across all pages


class DemoTracker:
    """Issues of one repository, generated from ``seed`` and changed only by :meth:`mutate`.

    Time comes from a logical clock, never the wall clock, so a seed and a sequence of
    ``mutate`` calls always produce byte-identical data.

    >>> tracker = DemoTracker(issues=3, seed=1)
    >>> len(tracker), [issue["number"] for issue in tracker.snapshot()]
    (3, [1, 2, 3])
    >>> tracker.mutate(create=1, update=1, delete=1)
    {'created': [4], 'updated': [2], 'deleted': [1]}
    """

    def __init__(
        self,
        *,
        issues: int = 50,
        seed: int = 0,
        start: datetime = DEFAULT_START,
        repo: str = "acme/widgets",
    ) -> None:
        if isinstance(issues, bool) or not isinstance(issues, int) or issues < 0:
            raise ValueError(f"issues must be a non-negative integer, got {issues!r}")
        owner, _, name = repo.partition("/")
        if not owner or not name or "/" in name:
            raise ValueError(f"repo must look like 'owner/name', got {repo!r}")
        self.seed = seed
        self.repo = repo
        self._lock = threading.Lock()
        # Record dicts in number order; numbers only grow, so this is also created_at order.
        self._issues: dict[int, dict[str, Any]] = {}
        self._blobs: dict[int, bytes] = {}  # pre-serialized records: a page is a bytes join
        self._updated: dict[int, int] = {}  # updated_at as epoch seconds, for since/sort
        self._views: dict[tuple[Any, ...], tuple[int, ...]] = {}
        # Separate streams: the initial data does not depend on how mutations draw numbers.
        self._mutate_rng = random.Random(f"changewatch-demo-mutate:{seed}")
        self._next_number = issues + 1
        # Building allocates ~1M small containers and no cycles; pausing the cyclic GC
        # spares it repeated full-heap scans and makes big builds about a third faster.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._clock = self._generate(issues, random.Random(seed), parse_ts(start))
        finally:
            if collecting:
                gc.enable()

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._issues)

    @property
    def clock(self) -> datetime:
        """The logical "now": no issue has a later ``updated_at``."""
        with self._lock:
            return datetime.fromtimestamp(self._clock, UTC)

    def get(self, number: int) -> dict[str, Any] | None:
        """A copy of one issue, or ``None`` if it never existed or was deleted."""
        blob = self.issue_json(number)
        return None if blob is None else orjson.loads(blob)

    def issue_json(self, number: int) -> bytes | None:
        """The serialized issue, as the API sends it."""
        with self._lock:
            return self._blobs.get(number)

    def snapshot(self) -> list[dict[str, Any]]:
        """Copies of all current issues in number order."""
        return orjson.loads(self.dumps())

    def dumps(self) -> bytes:
        """All current issues in number order as one JSON array."""
        with self._lock:
            return _join(self._blobs.values())

    def page(
        self,
        *,
        state: State = "open",
        since: str | datetime | None = None,
        sort: Sort = "created",
        direction: Direction = "desc",
        page: int = 1,
        per_page: int = 30,
    ) -> Page:
        """One page of a listing, with GitHub's filters and defaults (open issues, newest first).

        ``since`` keeps issues with ``updated_at >= since``. Raises ``ValueError`` on bad input.
        """
        if state not in ("open", "closed", "all"):
            raise ValueError(f"state must be open, closed or all, got {state!r}")
        if sort not in ("created", "updated"):
            raise ValueError(f"sort must be created or updated, got {sort!r}")
        if direction not in ("asc", "desc"):
            raise ValueError(f"direction must be asc or desc, got {direction!r}")
        if page < 1 or per_page < 1:
            raise ValueError("page and per_page must be at least 1")
        since_epoch = None if since is None else parse_ts(since)
        with self._lock:
            order = self._view(state, sort, direction, since_epoch)
            chosen = order[(page - 1) * per_page : page * per_page]
            blobs = self._blobs
            return Page(_join(blobs[n] for n in chosen), len(chosen), len(order))

    # -- changing --------------------------------------------------------------------------

    def mutate(self, *, create: int = 0, update: int = 0, delete: int = 0) -> dict[str, list[int]]:
        """Create, update and delete issues; returns the affected numbers, each list ascending.

        Updated and deleted issues are distinct existing ones. Every updated or created issue
        gets its own clock tick as ``updated_at``, later than any existing ``updated_at``.
        """
        for label, value in (("create", create), ("update", update), ("delete", delete)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be a non-negative integer, got {value!r}")
        with self._lock:
            if update + delete > len(self._issues):
                raise ValueError(
                    f"cannot update {update} and delete {delete}: "
                    f"only {len(self._issues)} issues exist"
                )
            rng = self._mutate_rng
            picked = rng.sample(list(self._issues), update + delete)
            updated, deleted = sorted(picked[:update]), sorted(picked[update:])
            for number in updated:
                self._clock += TICK
                self._change(self._issues[number], rng, self._clock)
                self._store(number, self._clock)
            created = []
            for _ in range(create):
                self._clock += TICK
                number = self._next_number
                self._next_number += 1
                self._issues[number] = self._new_issue(number, rng, self._clock)
                self._store(number, self._clock)
                created.append(number)
            for number in deleted:
                self._clock += TICK
                del self._issues[number], self._blobs[number], self._updated[number]
            if not picked and not create:
                self._clock += TICK  # an empty call still moves time forward
            self._views.clear()
            return {"created": created, "updated": updated, "deleted": deleted}

    def close(self, count: int = 1) -> list[int]:
        """Close the ``count`` open issues updated longest ago; returns their numbers, ascending.

        Stale issues are the ones people close, and these are never the ones ``mutate`` just
        opened or edited (those are the newest), so each closing reads as open -> closed. Each
        gets its own clock tick as ``updated_at`` and ``closed_at``. Raises ``ValueError`` when
        fewer than ``count`` issues are open.

        >>> tracker = DemoTracker(issues=6, seed=1)
        >>> [issue["state"] for issue in tracker.snapshot()]
        ['closed', 'closed', 'open', 'closed', 'closed', 'open']
        >>> tracker.close(1), [issue["state"] for issue in tracker.snapshot()]
        ([3], ['closed', 'closed', 'closed', 'closed', 'closed', 'open'])
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"close must be a non-negative integer, got {count!r}")
        with self._lock:
            open_issues = [n for n, issue in self._issues.items() if issue["state"] == "open"]
            if count > len(open_issues):
                raise ValueError(f"cannot close {count}: only {len(open_issues)} issues are open")
            stale = sorted(open_issues, key=lambda n: (self._updated[n], n))[:count]
            for number in stale:
                self._clock += TICK
                issue = self._issues[number]
                issue["state"] = "closed"
                issue["closed_at"] = issue["updated_at"] = format_ts(self._clock)
                self._store(number, self._clock)
            self._views.clear()
            return sorted(stale)

    # -- internals (callers hold the lock, or the object is still being built) -------------------

    def _generate(self, count: int, rng: random.Random, start: int) -> int:
        """Fill in issues 1..count; returns the clock: the latest timestamp generated."""
        created = clock = start
        for number in range(1, count + 1):
            issue = self._new_issue(number, rng, created)
            roll = rng.random()
            updated = created
            if roll >= 0.3:  # 30% were never touched after being opened
                updated = created + 1 + int(rng.random() * 5 * 86400)  # within five days
                issue["updated_at"] = format_ts(updated)
                issue["comments"] = int(roll * roll * 16)
                if roll >= 0.65:
                    issue["state"] = "closed"
                    issue["closed_at"] = issue["updated_at"]
                if updated > clock:
                    clock = updated
            self._issues[number] = issue
            self._store(number, updated)
            created += 60 + int(rng.random() * 1140)  # the next one opens 1 to 20 minutes later
        return clock

    def _new_issue(self, number: int, rng: random.Random, created: int) -> dict[str, Any]:
        """A freshly opened issue, created (and last updated) at ``created``."""
        rand = rng.random
        stamp = format_ts(created)
        title = (
            f"{_VERBS[int(rand() * len(_VERBS))]} {_SUBJECTS[int(rand() * len(_SUBJECTS))]}"
            f"{_QUALIFIERS[int(rand() * len(_QUALIFIERS))]}"
        )
        body_roll = rand()
        assignee_roll = rand()
        return {
            "id": 1_000_000 + number,
            "number": number,
            "title": title,
            "body": None if body_roll < 0.15 else _pick(_BODIES, body_roll),
            "state": "open",
            "labels": _pick_labels(rand()),
            "assignee": None if assignee_roll < 0.3 else {"login": _pick(USERS, assignee_roll)},
            "user": {"login": USERS[int(rand() * len(USERS))]},
            "comments": 0,
            "created_at": stamp,
            "updated_at": stamp,
            "closed_at": None,
            "html_url": f"{HTML_ROOT}/{self.repo}/issues/{number}",
        }

    @staticmethod
    def _change(issue: dict[str, Any], rng: random.Random, now: int) -> None:
        """Edit an issue the way people do; the comment count always moves, so it really changes."""
        stamp = format_ts(now)
        issue["comments"] += 1
        if rng.random() < 0.3:
            closing = issue["state"] == "open"
            issue["state"] = "closed" if closing else "open"
            issue["closed_at"] = stamp if closing else None
        if rng.random() < 0.25:
            names = {label["name"] for label in issue["labels"]} ^ {rng.choice(LABELS)}
            issue["labels"] = [{"name": name} for name in LABELS if name in names]
        if rng.random() < 0.15:
            current = issue["assignee"] and issue["assignee"]["login"]
            login = rng.choice([None, *(user for user in USERS if user != current)])
            issue["assignee"] = None if login is None else {"login": login}
        if rng.random() < 0.1:
            issue["title"] = f"{issue['title']} (revised)"
        issue["updated_at"] = stamp

    def _store(self, number: int, updated: int) -> None:
        """Refresh the serialized copy and sort key after an issue changed at ``updated``."""
        self._blobs[number] = orjson.dumps(self._issues[number])
        self._updated[number] = updated

    def _view(self, state: str, sort: str, direction: str, since: int | None) -> tuple[int, ...]:
        """Issue numbers matching a query, in order; cached until the next mutation."""
        key = (state, sort, direction, since)
        order = self._views.get(key)
        if order is not None:
            return order
        if sort == "created":
            numbers: Iterable[int] = self._issues  # number order is creation order
        else:
            numbers = sorted(self._updated, key=lambda n: (self._updated[n], n))
        if state != "all":
            numbers = [n for n in numbers if self._issues[n]["state"] == state]
        if since is not None:
            numbers = [n for n in numbers if self._updated[n] >= since]
        order = tuple(numbers)
        if direction == "desc":
            order = order[::-1]
        if len(self._views) >= _VIEW_CACHE_SIZE:
            del self._views[next(iter(self._views))]  # drop the oldest entry
        self._views[key] = order
        return order


def _join(blobs: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(blobs) + b"]"


def _pick(options: tuple[str, ...], roll: float) -> str:
    """An option chosen by a roll in [0, 1); reuses a roll already drawn for another decision."""
    return options[int(roll * 1_000_003) % len(options)]


def _pick_labels(roll: float) -> list[dict[str, str]]:
    """No label (35%), one (45%) or two (20%), in the fixed order of ``LABELS``.

    >>> _pick_labels(0.1), _pick_labels(0.5), _pick_labels(0.9)
    ([], [{'name': 'enhancement'}], [{'name': 'docs'}, {'name': 'security'}])
    """
    if roll < 0.35:
        return []
    slot = int(roll * 1_000_003)  # the low digits of the roll pick which labels
    first = slot % len(LABELS)
    if roll < 0.8:
        return [{"name": LABELS[first]}]
    second = (first + 1 + (slot // len(LABELS)) % (len(LABELS) - 1)) % len(LABELS)
    return [{"name": name} for name in LABELS if name in (LABELS[first], LABELS[second])]


__all__ = ["DEFAULT_START", "LABELS", "USERS", "DemoTracker", "Page", "format_ts", "parse_ts"]
