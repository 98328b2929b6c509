"""Detection delay of adaptive polling vs today's fixed interval, at the same request budget.

A simulated week (pure: no network, under a second of CPU) of ``--sources`` sources with different
change rates, seeded: a few busy ones whose changes come in bursts (``--busy``), some that
change every couple of hours (``--medium``), and the rest quiet, changing every few days. The
sync sensor ticks every ``TICK`` seconds; a source is probed at the first tick at or after it
is due, and a probe sees every change since the previous one. A change's detection delay is
the time from it to the first probe after it.

* fixed: today's behaviour, a probe per ``--interval`` slot (each source at its own phase);
* adaptive: the envelope of pipeline/polling/adaptive_envelope.py (the sensor's own code), bounded
by
  ``--min-interval`` and ``--max-interval``, starting at ``--interval``.

Printed: probes sent and mean detection delay of each (all changes, and per kind of source),
and whether the issue's target holds: adaptive at most the fixed requests, mean delay at least
``TARGET_CUT`` lower. Then the same week with errors injected (each probe of a source in an
outage fails: HTTP 500, or 429 with a ``Retry-After`` of minutes to over an hour), checking
every probe of the adaptive schedule: never sooner than ``--min-interval`` after the source's
previous probe, never before the time a ``Retry-After`` asked for.

Run from the repository root::

    .venv/bin/python bench/bench_adaptive.py
    .venv/bin/python bench/bench_adaptive.py --sources 100 --days 7 --seed 1
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from changewatch.pipeline.polling.adaptive_envelope import Bounds, Observation, first_state, observe

TICK = 30.0  # the sync sensor's minimum_interval_seconds
TARGET_CUT = 0.30
DAY = 86400.0


@dataclass
class Source:
    """One simulated source: its kind, change times, and outages (start, end, retry-after)."""

    kind: str
    changes: list[float]
    outages: list[tuple[float, float, float | None]] = field(default_factory=list)

    def failure(self, at: float) -> tuple[bool, float | None]:
        """Whether a probe at ``at`` fails, and the Retry-After its answer carries."""
        for start, end, retry_after in self.outages:
            if start <= at < end:
                return True, retry_after
        return False, None


@dataclass
class Outcome:
    """What one policy did over the trace: probes, and each change's detection delay."""

    probes: int = 0
    delays: dict[str, list[float]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def mean(self, kind: str | None = None) -> float:
        values = [d for k, ds in self.delays.items() if kind in (None, k) for d in ds]
        return sum(values) / len(values) if values else math.nan


def poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    """Times of a Poisson process of ``rate`` per second in ``[start, end)``."""
    times, at = [], start
    while True:
        at += rng.expovariate(rate)
        if at >= end:
            return times
        times.append(at)


def trace(args: argparse.Namespace) -> list[Source]:
    """The simulated sources: busy ones in bursts, medium ones steady, the rest quiet."""
    rng = random.Random(args.seed)
    horizon = args.days * DAY
    sources = []
    for index in range(args.sources):
        if index < args.busy:
            # A burst every ~4 h, lasting ~40 min, a change every ~3 min within it.
            changes: list[float] = []
            for burst in poisson(rng, 1 / (4 * 3600), 0, horizon):
                changes += poisson(rng, 1 / 180, burst, min(horizon, burst + 2400))
            sources.append(Source("busy", sorted(changes)))
        elif index < args.busy + args.medium:
            sources.append(Source("medium", poisson(rng, 1 / (2 * 3600), 0, horizon)))
        else:
            sources.append(Source("quiet", poisson(rng, 1 / (3 * DAY), 0, horizon)))
    return sources


def with_outages(sources: list[Source], args: argparse.Namespace) -> list[Source]:
    """The same sources, a third of them with outages: 500s, or 429s with Retry-After."""
    rng = random.Random(args.seed + 1)
    horizon = args.days * DAY
    hurt = []
    for index, source in enumerate(sources):
        outages = []
        if index % 3 == 0:
            for start in poisson(rng, 1 / DAY, 0, horizon):
                length = rng.uniform(600, 4 * 3600)
                retry_after = rng.choice([None, 120.0, 900.0, 5400.0])  # None: a 500
                outages.append((start, start + length, retry_after))
        hurt.append(Source(source.kind, source.changes, outages))
    return hurt


def on_tick(at: float) -> float:
    """When a probe due at ``at`` goes out: the sensor's first tick at or after it."""
    return math.ceil(at / TICK) * TICK


def run(
    sources: list[Source], horizon: float, next_probe: Callable[[int], Callable[..., float]]
) -> Outcome:
    """Probe every source on its policy's schedule; record probes, delays and violations."""
    outcome = Outcome()
    for index, source in enumerate(sources):
        policy = next_probe(index)
        at, seen_upto, previous = policy(None, None), 0, None
        while at < horizon:
            outcome.probes += 1
            failed, retry_after = source.failure(at)
            changed = False
            if not failed:
                upto = bisect.bisect_right(source.changes, at)
                delays = outcome.delays.setdefault(source.kind, [])
                delays += [at - t for t in source.changes[seen_upto:upto]]
                changed, seen_upto = upto > seen_upto, upto
            kind = "failed" if failed else ("changed" if changed else "unchanged")
            following = policy(at, Observation(kind, retry_after=retry_after))
            outcome.violations += check(index, previous, at, following, retry_after, policy)
            previous, at = at, following
    return outcome


def check(
    index: int,
    previous: float | None,
    at: float,
    following: float,
    retry_after: float | None,
    policy: Callable[..., float],
) -> list[str]:
    """The rules an adaptive schedule keeps: min_interval between probes, Retry-After."""
    found = []
    floor = getattr(policy, "min_interval", 0.0)
    if previous is not None and at - previous < floor:
        found.append(f"source {index}: probes {at - previous:.0f}s apart (< {floor:.0f}s)")
    if retry_after is not None and following < at + retry_after:
        found.append(f"source {index}: probe at +{following - at:.0f}s ignores Retry-After")
    return found


def fixed(interval: float, seed: int) -> Callable[[int], Callable[..., float]]:
    """Today's policy: a probe per interval slot, each source at its own phase."""

    def make(index: int) -> Callable[..., float]:
        phase = random.Random(seed * 1000 + index).uniform(0, interval)

        def policy(at: float | None, seen: Observation | None) -> float:
            if at is None:
                return on_tick(phase)
            return on_tick(phase + (math.floor((at - phase) / interval) + 1) * interval)

        return policy

    return make


def adaptive(bounds: Bounds, seed: int) -> Callable[[int], Callable[..., float]]:
    """The envelope's policy: each probe's observation decides when the next one is due."""

    def make(index: int) -> Callable[..., float]:
        start = random.Random(seed * 1000 + index).uniform(0, bounds.start)
        state = first_state(bounds, on_tick(start))

        def policy(at: float | None, seen: Observation | None) -> float:
            nonlocal state
            if at is not None and seen is not None:
                state = observe(state, seen, at, bounds)
            return on_tick(state.next_due)

        policy.min_interval = bounds.min_interval  # type: ignore[attr-defined]
        return policy

    return make


def report(label: str, outcome: Outcome, kinds: list[str]) -> str:
    per_kind = ", ".join(f"{k} {outcome.mean(k) / 60:.1f}" for k in kinds if outcome.delays.get(k))
    return (
        f"{label:<9} probes {outcome.probes:>7,}  mean detection delay "
        f"{outcome.mean() / 60:6.2f} min  ({per_kind} min)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=100)
    parser.add_argument("--busy", type=int, default=5, help="sources changing in bursts")
    parser.add_argument("--medium", type=int, default=15, help="sources changing every ~2 h")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=900.0, help="today's fixed interval")
    parser.add_argument("--min-interval", type=float, default=120.0)
    parser.add_argument("--max-interval", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.process_time()
    horizon = args.days * DAY
    bounds = Bounds(args.min_interval, args.max_interval, args.interval)
    sources = trace(args)
    kinds = ["busy", "medium", "quiet"]
    changes = sum(len(s.changes) for s in sources)
    print(
        f"trace: {args.sources} sources ({args.busy} busy, {args.medium} medium, "
        f"{args.sources - args.busy - args.medium} quiet), {args.days:g} days, {changes:,} "
        f"changes; sensor tick {TICK:g}s"
    )
    print(
        f"fixed: every {args.interval:g}s; adaptive: min_interval {args.min_interval:g}s, "
        f"max_interval {args.max_interval:g}s, start {args.interval:g}s"
    )
    today = run(sources, horizon, fixed(args.interval, args.seed))
    envelope = run(sources, horizon, adaptive(bounds, args.seed))
    print(report("fixed", today, kinds))
    print(report("adaptive", envelope, kinds))
    cut = 1 - envelope.mean() / today.mean()
    within = envelope.probes <= today.probes
    met = within and cut >= TARGET_CUT
    print(
        f"budget: adaptive {envelope.probes / today.probes:.0%} of fixed probes "
        f"({'within' if within else 'OVER'}); mean delay {cut:.0%} lower "
        f"(target >= {TARGET_CUT:.0%}): {'TARGET MET' if met else 'TARGET MISSED'}"
    )
    hurt = with_outages(sources, args)
    outages = sum(len(s.outages) for s in hurt)
    faulty = run(hurt, horizon, adaptive(bounds, args.seed))
    print(
        f"errors: {outages} outages on {sum(1 for s in hurt if s.outages)} sources (HTTP 500, "
        f"or 429 with Retry-After 2m/15m/1h30m): {report('adaptive', faulty, kinds).strip()}"
    )
    print(
        f"errors: probes sooner than min_interval or before Retry-After: "
        f"{len(faulty.violations)}" + "".join(f"\n  {v}" for v in faulty.violations[:5])
    )
    print(f"cpu: {time.process_time() - started:.2f} s")
    return 0 if not faulty.violations else 1


if __name__ == "__main__":
    sys.exit(main())
