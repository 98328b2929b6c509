"""The learned-stage tests run the CLI as the pipeline tests do, with their helpers."""

from __future__ import annotations

import sys
from pathlib import Path

# `pytest tests/learn` alone does not put tests/pipeline (test_cli's run_cli) on the path.
_PIPELINE_TESTS = str(Path(__file__).resolve().parents[1] / "pipeline")
if _PIPELINE_TESTS not in sys.path:
    sys.path.append(_PIPELINE_TESTS)
