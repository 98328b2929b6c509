"""Latency of the offline judge (`model: local`): the bundled SmolLM2-135M-Instruct on llama.cpp.

Judges ``--changes`` new issues of the demo tracker with the demo's ``security_review`` judge
(its condition and examples from ``watches.yaml``, the model set to ``local``), each through
the judge's one code path (openai client -> loopback endpoint -> llama.cpp with the verdict's
JSON schema as a grammar -> instructor's validation), one at a time, as an evaluation does.
The verdict cache is not involved: every change is a fresh call.

It prints the model load time (first use: load the GGUF, start the endpoint), the first
verdict's latency (it reads the whole prompt; later ones reuse the system prompt from
llama.cpp's cache), then p50/p95/max latency per verdict over the rest, prompt and completion
tokens per verdict, requests per verdict (validation re-asks included), changes left without
a verdict, how many would notify, the process's peak RSS (``ru_maxrss``) and the load average
(other processes slow every figure). It needs the ``[local]`` extra; without it, it says so
and exits 2.

Run from the repository root::

    .venv/bin/python bench/bench_local_judge.py                 # 20 changes
    .venv/bin/python bench/bench_local_judge.py --changes 5 --threads 2
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the package is installed editable; this is only a fallback
    sys.path.insert(0, str(REPO))

from changewatch.evaluators import local_model  # noqa: E402
from changewatch.evaluators.judge import ChangeForJudge, Judge  # noqa: E402
from changewatch.pipeline.project.watches_file import load_config  # noqa: E402
from changewatch.sources.demo import DemoTracker  # noqa: E402

FIELDS = ("number", "title", "state", "labels", "comments")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def changes(count: int) -> list[ChangeForJudge]:
    """``count`` inserts of demo issues, as the security_review watch's judge sees them."""
    issues = DemoTracker(issues=count, seed=7).snapshot()
    return [
        ChangeForJudge(
            watch="security_review",
            source="demo_issues",
            kind="insert",
            object_key=str(issue["number"]),
            old=None,
            new={
                k: [label["name"] for label in issue["labels"]] if k == "labels" else issue[k]
                for k in FIELDS
            },
            changed_columns=None,
        )
        for issue in issues
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20, help="verdicts to time")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp CPU threads")
    args = parser.parse_args()
    if not local_model.available():
        print(f"bench_local_judge: {local_model.INSTALL_HINT}", file=sys.stderr)
        return 2

    demo = load_config(REPO / "watches.yaml").watch("security_review").judge
    assert demo is not None
    config = demo.model_copy(update={"model": "local", "max_retries": 2})
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    local_model.base_url(threads=args.threads)  # load the model, start the endpoint
    load_s = time.perf_counter() - start
    print(f"model: {local_model.model_path()}")
    print(f"model load + endpoint start: {load_s:.2f} s (peak RSS {rss_before:.0f} -> "
          f"{peak_rss_mb():.0f} MiB)")  # fmt: skip

    outcomes = []
    with Judge(config) as judge:
        for change in changes(args.changes):
            outcomes.append(judge.evaluate(change))
    first, rest = outcomes[0], outcomes[1:] or outcomes
    latencies = sorted(o.latency_ms for o in rest)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    answered = [o for o in outcomes if o.verdict is not None]
    completion = sum(o.completion_tokens for o in outcomes)
    seconds = sum(o.latency_ms for o in outcomes) / 1000
    print(f"first verdict: {first.latency_ms} ms (reads the whole prompt)")
    print(
        f"latency per verdict over {len(rest)}: p50 {statistics.median(latencies):.0f} ms, "
        f"p95 {p95} ms, max {latencies[-1]} ms"
    )
    print(
        f"tokens per verdict: {statistics.mean(o.prompt_tokens for o in outcomes):.0f} prompt, "
        f"{statistics.mean(o.completion_tokens for o in outcomes):.0f} completion; "
        f"{completion / seconds:.1f} completion tokens per second of latency"
    )
    print(
        f"requests per verdict: {statistics.mean(o.attempts for o in outcomes):.2f}; "
        f"without a verdict: {len(outcomes) - len(answered)} of {len(outcomes)}; "
        f"would notify: {sum(o.notify for o in outcomes)}"
    )
    for outcome in outcomes:
        if outcome.error:
            print(f"   no verdict: {outcome.error}")
    print(f"peak RSS: {peak_rss_mb():.0f} MiB")
    # Other processes' load changes every figure above: say how busy the machine was.
    print(f"load average (1/5/15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
