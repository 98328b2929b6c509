"""`model: local` is recorded by the file it runs: its name and content hash (issue 33, 5)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from changewatch.evaluators import local_model
from changewatch.evaluators.judge import model_identity


def _gguf(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def test_the_local_model_is_named_by_file_and_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _gguf(tmp_path / "a.gguf", b"GGUF one model")
    monkeypatch.setenv(local_model.MODEL_ENV, str(first))
    digest = hashlib.sha256(b"GGUF one model").hexdigest()[:16]
    assert model_identity("local") == f"local:a.gguf@{digest}"

    # Another file: another identity, so no verdict of the first is reused.
    second = _gguf(tmp_path / "b.gguf", b"GGUF another model")
    monkeypatch.setenv(local_model.MODEL_ENV, str(second))
    assert model_identity("local").startswith("local:b.gguf@")
    assert model_identity("local") != f"local:b.gguf@{digest}"

    # The same name with other content (a model replaced in place) is another model too.
    monkeypatch.setenv(local_model.MODEL_ENV, str(first))
    first.write_bytes(b"GGUF replaced, a longer file")
    assert model_identity("local") != f"local:a.gguf@{digest}"


def test_a_missing_local_file_and_a_served_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(local_model.MODEL_ENV, str(tmp_path / "gone.gguf"))
    assert model_identity("local") == "local:gone.gguf@missing"
    assert model_identity("gpt-4o-mini") == "gpt-4o-mini"
