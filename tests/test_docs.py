"""The docs site builds in strict mode, its generated references cover the code, and the
watches-file examples a user copies validate against the config models."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from changewatch.evaluators.config import JudgeConfig
from changewatch.evaluators.evals import ExamplesFile
from changewatch.pipeline.cli.command_line import _parser
from changewatch.pipeline.project.watches_file import ChangewatchConfig, load_config
from changewatch.sources import SourceConfig
from cw_testing import REPO
from pydantic import BaseModel, TypeAdapter

MKDOCS = Path(sys.executable).with_name("mkdocs")
PAGES = sorted((REPO / "docs").glob("*.md"))
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def hooks() -> Any:
    """docs/hooks.py, the mkdocs hook, as a module."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # No --quiet: it hides warnings from the count --strict fails on (a broken link passed).
        [str(MKDOCS), "build", "--strict", "-f", str(project / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_in_strict_mode_with_its_generated_pages(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    watches = (tmp_path / "site" / "reference" / "watches-file" / "index.html").read_text()
    assert "max_response_bytes" in watches and "64MiB" in watches
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "changewatch sql" in cli and "--timeout SECONDS" in cli


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO / "docs", project / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "ARCHITECTURE.md"):  # the hook reads the second
        shutil.copy(REPO / name, project / name)
    with (project / "docs" / "sql.md").open("a") as page:
        page.write("\nSee [the tables](no-such-page.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_every_setting_has_a_description_in_the_reference() -> None:
    module = hooks()
    page = module.watches_reference()
    missing = []
    for model, _ in module._models(ChangewatchConfig, "the file"):
        assert f"## {model.__name__} " in page
        for key, field in module._fields(model):
            if not (field.description or "").strip():
                missing.append(f"{model.__name__}.{key}")
            assert f"| `{key}` |" in page
    assert missing == [], "settings without Field(description=...): " + ", ".join(missing)


def test_the_cli_reference_has_every_command_and_option() -> None:
    page = hooks().cli_reference()
    [commands] = [a for a in _parser()._actions if hasattr(a, "choices") and a.dest == "command"]
    for name, parser in commands.choices.items():
        assert f"## changewatch {name}\n" in page
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page, (name, option)


def fragment_problems(data: Any, model: type[BaseModel], where: str) -> list[str]:
    """What is wrong with the settings a partial example (``# ...`` for the rest) writes:
    each key must be a field of ``model``, each value valid for that field."""
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    problems = []
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            problems.append(f"{where}: unknown key {key!r}")
            continue
        try:
            kind = (
                Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            )
            TypeAdapter(kind).validate_python(value)
        except ValueError as error:
            problems.append(f"{where}.{key}: {error}")
    return problems


def source_model(item: dict) -> type[BaseModel]:
    adapter_union = SourceConfig.__origin__  # RestSourceConfig | GitHubSourceConfig | ...
    kinds = {m.model_fields["type"].annotation.__args__[0]: m for m in adapter_union.__args__}
    return kinds[item.get("type", "rest")]


def examples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for number, match in enumerate(YAML_BLOCK.finditer(page.read_text()), 1):
            found.append((f"{page.name}#{number}", match.group(1)))
    return found


@pytest.mark.parametrize(("where", "text"), examples(), ids=[w for w, _ in examples()])
def test_the_yaml_examples_in_the_docs_validate(where: str, text: str) -> None:
    data = yaml.safe_load(text)
    if "attributes" in data:
        # A Dagster defs.yaml (tests/pipeline/test_component.py loads one): its type imports,
        # and its attributes are the component's.
        module, _, name = data["type"].rpartition(".")
        component = getattr(importlib.import_module(module), name)
        assert set(data["attributes"]) <= {f.name for f in dataclasses.fields(component)}
        return
    partial = "# ..." in text
    sections = ChangewatchConfig.model_fields
    problems = []
    for key, value in data.items():
        if key == "judge":
            JudgeConfig.model_validate(value)
        elif key == "examples":
            ExamplesFile.model_validate(data)
        elif key in sections and partial and key == "sources":
            for index, item in enumerate(value):
                problems += fragment_problems(item, source_model(item), f"sources[{index}]")
        elif key in sections:
            TypeAdapter(sections[key].annotation).validate_python(value)
        else:
            problems.append(f"unknown section {key!r}")
    assert problems == []


def test_the_readme_watch_of_your_own_loads_with_the_demo_file(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    tour = readme.split("### 4. A watch of your own", 1)[1]
    [block] = YAML_BLOCK.findall(tour.split("\n## ", 1)[0])
    watches = (REPO / "watches.yaml").read_text()
    # Added at the end of the demo's `watches:` list, as the README says.
    head, rest = watches.split("\nwatches:\n", 1)
    following = re.search(r"^\S", rest, re.M)
    cut = following.start() if following else len(rest)
    file = tmp_path / "watches.yaml"
    file.write_text(f"{head}\nwatches:\n{rest[:cut]}{block}\n{rest[cut:]}")
    config = load_config(file)
    watch = config.watch("unassigned_bugs")
    assert watch.sources == ["demo_issues"] and watch.channels == ["console"]


def test_fragment_check_names_a_misspelt_key() -> None:
    # The partial examples' check must be able to fail.
    item = {"name": "releases", "intervall": "15m", "stop": {"untill": "2027-06-30"}}
    problems = fragment_problems(item, source_model(item), "sources[0]")
    assert problems[0] == "sources[0]: unknown key 'intervall'"
    assert "untill" in problems[1]


def test_the_hook_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(hooks()).failed == 0


def test_links_to_repository_files_become_their_paths_unless_missing() -> None:
    from types import SimpleNamespace

    config = SimpleNamespace(docs_dir=str(REPO / "docs"), config_file_path=str(REPO / "mkdocs.yml"))
    page = SimpleNamespace(file=SimpleNamespace(src_path="security.md"))
    text = (
        "See [the HTTP policy](../sources/http.py), [`sources/http.py`](../sources/http.py), "
        "[gone](../pipeline/receiver.py) and [SQL](sql.md)."
    )
    assert hooks().on_page_markdown(text, page, config, None) == (
        "See the HTTP policy (`sources/http.py`), `sources/http.py`, "
        "[gone](../pipeline/receiver.py) and [SQL](sql.md)."
    )
