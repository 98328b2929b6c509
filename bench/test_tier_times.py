"""Where a test tier's time goes: per-file sums from pytest's JUnit XML, and the workers' bound.

The fast tier runs on four xdist workers taking a whole file at a time (`--dist loadfile`), so
its wall time is at least the larger of (the longest file) and (the summed test-seconds / 4),
and what a worker's files add up to decides the end. This reads one or more `--junitxml`
reports and prints, per file: its tests, its summed seconds (setup + call + teardown, as
JUnit's `time` counts them) and, where tests/conftest.py recorded it, the CPU seconds the
worker process and the children it waited for used during them. The CPU column says whether
a slow file is working or waiting: a file of 60 s and 2 CPU-s is sleeping or polling.

Two reports side by side (before, after) print both columns for each file, and the totals.

Run: `python bench/test_tier_times.py before.xml [after.xml] [--top 40]`, reports written by
`pytest --junitxml=...`.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class FileTotals:
    tests: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    slowest: list[tuple[float, str]] = field(default_factory=list)


def read(path: str) -> tuple[dict[str, FileTotals], float]:
    """Per-file totals of one report, and the suite's wall time as pytest reported it."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0)) for s in suites)
    totals: dict[str, FileTotals] = defaultdict(FileTotals)
    for case in root.iter("testcase"):
        # classname is dotted: "pipeline.test_cli" or "pipeline.test_cli.TestX"; the file is
        # the part up to the last component that starts with "test_".
        parts = (case.get("classname") or "").split(".")
        cut = max((i for i, p in enumerate(parts) if p.startswith("test_")), default=len(parts) - 1)
        name = "/".join(parts[: cut + 1]) + ".py"
        t = totals[name]
        t.tests += 1
        seconds = float(case.get("time", 0))
        t.seconds += seconds
        t.slowest.append((seconds, case.get("name", "")))
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                t.cpu += float(prop.get("value", 0))
    return totals, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="JUnit XML reports (before, after)")
    parser.add_argument("--top", type=int, default=40, help="files to list, slowest first")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    runs = [read(p) for p in args.reports]
    names = sorted(
        set().union(*(r[0] for r in runs)),
        key=lambda n: -max(r[0][n].seconds if n in r[0] else 0 for r in runs),
    )
    head = "".join(f" | {'tests':>5} {'sum s':>7} {'cpu s':>7}" for _ in runs)
    print(f"{'file':<52}{head}")
    for name in names[: args.top]:
        row = ""
        for totals, _ in runs:
            t = totals.get(name)
            row += (
                f" | {t.tests:>5} {t.seconds:>7.1f} {t.cpu:>7.1f}"
                if t
                else f" | {'-':>5} {'-':>7} {'-':>7}"
            )
        print(f"{name:<52}{row}")
    for path, (totals, wall) in zip(args.reports, runs, strict=True):
        tests = sum(t.tests for t in totals.values())
        seconds = sum(t.seconds for t in totals.values())
        cpu = sum(t.cpu for t in totals.values())
        longest = max(totals.values(), key=lambda t: t.seconds)
        longest_name = next(n for n, t in totals.items() if t is longest)
        bound = max(longest.seconds, seconds / args.workers)
        print(
            f"{path}: {tests} tests, {seconds:.1f} test-s summed, {cpu:.1f} CPU-s recorded, "
            f"pytest's wall {wall:.1f} s; longest file {longest_name} {longest.seconds:.1f} s; "
            f"no {args.workers}-worker schedule ends before {bound:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
