"""Which offline model to ship as `model: local`: candidates tuned on evals/ tune, scored on test.

For each candidate (the bundled SmolLM2-135M-Instruct, and every ``--gguf PATH``), in a child
process of its own (the local endpoint serves one model per process), with llama.cpp's
grammar-constrained output (the verdict's JSON schema as a grammar, evaluators/local_model.py):

1. tune: every ``split: tune`` example of ``evals/`` is judged under each prompt variant
   (``VARIANTS``: the file's condition alone, or with notify/skip examples written from the
   tune examples' reasons), once, with ``min_confidence`` 0; each variant is then scored at
   each threshold of ``THRESHOLDS`` from the same answers (a verdict notifies when it says so
   at least that sure). The best F1 on `tune` picks the variant and threshold;
2. test: the held-out ``split: test`` examples are judged with that variant and threshold,
   through the same code as ``changewatch eval`` (evaluators/eval_run.py, eval_report.py).

Printed: per model its file size, the tune scores of each variant at its best threshold, the
choice, and on `test` precision, recall, F1, invalid answers and latency p50/p95 per verdict,
with the load average (other processes on the machine slow every latency figure). Each
model's results are kept as JSON lines in ``--results`` (a temporary folder by default). It
needs the ``[local]`` extra; without it, it says so and exits 2.

Run from the repository root (an hour of CPU on two cores for both shipped models)::

    .venv-local/bin/python bench/bench_judge_models.py --gguf /path/to/gemma-3-270m.gguf --jobs 2
    .venv-local/bin/python bench/bench_judge_models.py --limit 2      # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the package is installed editable; this is only a fallback
    sys.path.insert(0, str(REPO))

from changewatch.evaluators import local_model  # noqa: E402
from changewatch.evaluators.config import JudgeConfig  # noqa: E402
from changewatch.evaluators.eval_report import ALL, report  # noqa: E402
from changewatch.evaluators.eval_results import EvalResult, ResultsWriter, read_results  # noqa: E402
from changewatch.evaluators.eval_run import EvalSet, run_eval  # noqa: E402
from changewatch.evaluators.evals import example_files, load_examples_file  # noqa: E402

EVALS = REPO / "evals"
# Prompt variants tuned over: how many notify and skip examples (from the tune split's
# reasons) the judge's prompt lists.
VARIANTS = {"condition only": 0, "condition + 4 examples each way": 4}
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def eval_sets(split: str, shots: int, min_confidence: float, limit: int | None) -> list[EvalSet]:
    """Each examples file of evals/ as a set: its ``split`` examples, judged by the local model
    against its condition, with ``shots`` examples each way from its tune split's reasons."""
    sets = []
    for path in example_files([EVALS]):
        file = load_examples_file(path)
        tune = [e for e in file.examples if e.split == "tune" and e.reason]
        judge = JudgeConfig(
            condition=file.condition or "",
            model="local",
            min_confidence=min_confidence,
            examples=[e.reason for e in tune if e.expect == "notify"][:shots],  # type: ignore[misc]
            negative_examples=[e.reason for e in tune if e.expect == "skip"][:shots],  # type: ignore[misc]
        )
        examples = [e for e in file.examples if e.split == split][:limit]
        sets.append(EvalSet(path.stem, path.stem, judge, examples, path))
    return sets


def f1_at(results: list[EvalResult], threshold: float) -> float:
    """F1 of ``results`` (judged with min_confidence 0) had they needed ``threshold``."""
    notify = [r.got == "notify" and (r.confidence or 0) >= threshold for r in results]
    wanted = [r.expect == "notify" for r in results]
    hits = sum(n and w for n, w in zip(notify, wanted, strict=True))
    flagged, expected = sum(notify), sum(wanted)
    if not hits:
        return 0.0
    precision, recall = hits / flagged, hits / expected
    return 2 * precision * recall / (precision + recall)


def judge_all(sets: list[EvalSet], results: Path) -> list[EvalResult]:
    with ResultsWriter(results) as writer:
        stopped = run_eval(sets, [None], writer)
    if stopped:
        raise SystemExit(f"bench_judge_models: {stopped[0]}")
    return read_results(results)


def one_model(out: Path, limit: int | None) -> dict[str, Any]:
    """Tune and test the model the local endpoint serves; results files go to ``out``."""
    tuned = {}
    for name, shots in VARIANTS.items():
        results = judge_all(eval_sets("tune", shots, 0.0, limit), out / f"tune-{shots}.jsonl")
        best = max(THRESHOLDS, key=lambda t: f1_at(results, t))
        tuned[name] = {"threshold": best, "f1": round(f1_at(results, best), 4)}
    variant = max(tuned, key=lambda name: tuned[name]["f1"])  # ties: the first, the shorter
    threshold = tuned[variant]["threshold"]
    sets = eval_sets("test", VARIANTS[variant], threshold, limit)
    (overall,) = [m["conditions"][ALL] for m in report(judge_all(sets, out / "test.jsonl"))]
    return {
        "tune": tuned,
        "variant": variant,
        "threshold": threshold,
        "test": {k: overall[k] for k in ("examples", "precision", "recall", "f1", "invalid")}
        | {"latency_ms": overall["latency_ms"]},
        "load": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", action="append", default=[], help="another candidate model")
    parser.add_argument("--limit", type=int, help="examples per file and split (a smoke run)")
    parser.add_argument("--results", help="where the results files go (default: a temp dir)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="models judged at once (llama.cpp: a core each)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: results folder
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_model(Path(args.one), args.limit)))
        return 0
    if not local_model.available():
        print(f"bench_judge_models: {local_model.INSTALL_HINT}", file=sys.stderr)
        return 2

    bundled = local_model.model_path()
    assert bundled is not None
    out = Path(args.results or tempfile.mkdtemp(prefix="cw-judge-models-"))
    print(f"examples: {EVALS} (tuned on split tune, scored on split test); results in {out}")
    paths = [bundled, *map(Path, args.gguf)]
    children: list[subprocess.Popen[str]] = []
    for path in paths:
        if len(children) >= args.jobs:  # at most --jobs at once (each takes one core)
            children[-args.jobs].wait()
        folder = out / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, __file__, "--one", str(folder)]
        command += ["--limit", str(args.limit)] if args.limit else []
        env = os.environ | {local_model.MODEL_ENV: str(path)}
        children.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for path, child in zip(paths, children, strict=True):
        stdout, stderr = child.communicate()
        if child.returncode:
            print(f"{path.name}: failed\n{stderr[-2000:]}", file=sys.stderr)
            return 1
        m = json.loads(stdout.splitlines()[-1])
        test = m["test"]
        print(f"\n{path.name} ({path.stat().st_size / 1e6:.0f} MB)")
        for name, tuned in m["tune"].items():
            print(f"  tune: {name}: F1 {tuned['f1']:.2f} at min_confidence {tuned['threshold']}")
        print(f"  chosen: {m['variant']}, min_confidence {m['threshold']}")
        print(
            f"  test ({test['examples']} examples): precision {_share(test['precision'])}, "
            f"recall {_share(test['recall'])}, F1 {_share(test['f1'])}, invalid "
            f"{test['invalid']}; latency p50 {test['latency_ms']['p50']} ms, p95 "
            f"{test['latency_ms']['p95']} ms (load average {m['load'][0]:.1f}, "
            f"{m['load'][1]:.1f}, {m['load'][2]:.1f} at the end)"
        )
    return 0


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
