"""`changewatch train WATCH` without a learned stage, or an unknown watch: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from cw_testing import REPO
from test_cli import run_cli


def test_train_names_what_is_missing_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    env = {"DAGSTER_HOME": str(tmp_path)}
    done = run_cli("train", "security_review", cwd=tmp_path, **env)
    assert (done.returncode, done.stderr) == (
        2,
        "changewatch: watch 'security_review' has no learned stage: name it first in its judge "
        "(judge: [{model: learned, condition: ...}, {model: ..., when: unsure}])\n",
    )
    done = run_cli("train", "nope", cwd=tmp_path, **env)
    assert done.returncode == 2 and done.stderr.startswith("changewatch: no watch 'nope'")
