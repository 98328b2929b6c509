"""`changewatch eval --cross-validate K`: the learned stage's table on an examples file."""

from __future__ import annotations

from pathlib import Path

import yaml
from cw_testing import REPO
from test_cli import run_cli
from test_learned_stage import CONDITION, _examples


def test_cross_validation_prints_stages_constants_and_a_curve(tmp_path: Path) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    examples = [e.model_dump(mode="json", exclude_none=True) for e in _examples(30)]
    file = tmp_path / "drops.yaml"
    file.write_text(yaml.safe_dump({"condition": CONDITION, "examples": examples}))
    done = run_cli(
        "eval", "--cross-validate", "3", "--examples", str(file), cwd=tmp_path, timeout=900,
        DAGSTER_HOME=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| examples | stage | train labels | precision | recall | F1 |")
    rows = [line.split(" | ") for line in lines[2:]]
    stages = [(row[1], row[2]) for row in rows]
    assert stages == [
        ("always-notify", "-"), ("always-skip", "-"),
        ("learned", "10"), ("cascade", "10"), ("learned", "20"), ("cascade", "20"),
    ]
    # Half the changes are big drops: always-notify's precision is 0.50, recall 1.00.
    assert rows[0][3:6] == ["0.50", "1.00", "0.67"]
    # With all 20 training labels the price diffs separate them: F1 well above the constant.
    assert float(rows[4][5]) >= 0.9, lines


def test_cross_validation_names_a_bad_k(tmp_path: Path) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    done = run_cli("eval", "--cross-validate", "1", cwd=tmp_path, DAGSTER_HOME=str(tmp_path))
    assert (done.returncode, done.stderr) == (
        2, "changewatch: --cross-validate needs K of at least 2 folds\n"
    )
