"""MkDocs hook: the pages generated from the repository each time the site builds.

``reference/watches-file.md`` is rendered from the pydantic models of the watches file (each
setting's key, type, default and ``Field(description=...)``), ``reference/cli.md`` from the
argument parser of ``changewatch`` (pipeline/cli/command_line.py), and ``architecture.md`` is
ARCHITECTURE.md. None of them is a file under docs/, so none can drift from what it shows.
"""

from __future__ import annotations

import argparse
import os
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

WATCHES_PAGE = "reference/watches-file.md"
CLI_PAGE = "reference/cli.md"
ARCHITECTURE_PAGE = "architecture.md"

# Validators that turn the file's text into a value, by what they accept (readable types).
_VALIDATED = {
    "parse_duration": "duration",
    "_duration": "duration",
    "parse_size": "size",
    "_env_name": "env var name",
    "_identifier": "name",
    "_email": "email address",
}


def on_files(files: Any, config: Any) -> Any:
    """Add the two generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, render in ((WATCHES_PAGE, watches_reference), (CLI_PAGE, cli_reference)):
        files.append(File.generated(config, path, content=render()))
    # ARCHITECTURE.md stays at the top of the repository, where a reader of the tree finds it;
    # the site shows the same text rather than a copy that could fall behind.
    architecture = Path(config.config_file_path).parent / "ARCHITECTURE.md"
    files.append(File.generated(config, ARCHITECTURE_PAGE, content=architecture.read_text()))
    return files


# Pages may point at the repository's own files (`[sources/http.py](../sources/http.py)`),
# which are not pages of the site. A link to a file that exists becomes its path in code type;
# one to a file that does not is left alone, so the strict build still fails on it.
_REPO_LINK = re.compile(r"\[([^\]]+)\]\((\.\./[^)#\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Links from a page to repository files outside docs/: their paths, in code type."""
    docs = Path(config.docs_dir).resolve()
    repo = Path(config.config_file_path).resolve().parent
    here = (docs / page.file.src_path).parent

    def plain(match: re.Match[str]) -> str:
        target = (here / match.group(2)).resolve()
        if target.is_relative_to(docs) or not target.is_relative_to(repo) or not target.exists():
            return match.group(0)
        text, path = match.group(1), target.relative_to(repo).as_posix()
        return text if text.strip("`") == path else f"{text} (`{path}`)"

    return _REPO_LINK.sub(plain, markdown)


# --- the watches file ------------------------------------------------------------------------


def watches_reference() -> str:
    """The watches-file reference page: one table per settings model, top down."""
    from changewatch.pipeline.project.watches_file import ChangewatchConfig

    lines = [
        "# The watches file",
        "",
        "Every setting of `watches.yaml` (or the file `$CHANGEWATCH_CONFIG` names), generated from",
        "the pydantic models that validate it. Durations are seconds or text such as `90s`, `5m`,",
        "`2h`, `1d`; sizes are bytes or text such as `64MiB`. A secret is never a value of the",
        "file: an *env var name* setting names the environment variable that holds it.",
        "",
    ]
    for model, where in _models(ChangewatchConfig, "the file"):
        lines += _model_section(model, where)
    return "\n".join(lines) + "\n"


def _models(root: type[BaseModel], where: str) -> Iterator[tuple[type[BaseModel], str]]:
    """Each model reachable from ``root`` once, breadth first, with where it is first used."""
    seen: set[type[BaseModel]] = set()
    queue: list[tuple[type[BaseModel], str]] = [(root, where)]
    while queue:
        model, used = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        yield model, used
        for key, field in _fields(model):
            for inner in _nested(field.annotation):
                queue.append((inner, f"`{key}` of {_anchor_link(model)}"))


def _fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    return [(field.alias or name, field) for name, field in model.model_fields.items()]


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _nested(arg)]


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _anchor_link(model: type[BaseModel]) -> str:
    return f"[{model.__name__}](#{_anchor(model)})"


def _model_section(model: type[BaseModel], where: str) -> list[str]:
    # The whole docstring: later paragraphs often say what the table cannot (defaults a
    # validator fills in, how settings work together). reST's ``code`` becomes `code`.
    paragraphs = [" ".join(p.split()) for p in (model.__doc__ or "").split("\n\n") if p.strip()]
    paragraphs = [p.replace("``", "`") for p in paragraphs] or [""]
    lines = [f"## {model.__name__} {{#{_anchor(model)}}}", ""]
    lines += [f"*Used as {where}.* {paragraphs[0]}", "", *(f"{p}\n" for p in paragraphs[1:])]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for key, field in _fields(model):
        description = " ".join((field.description or "").split())
        cells = [f"`{key}`", _type_text(field), _default_text(field), description]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return [*lines, ""]


def _type_text(field: FieldInfo) -> str:
    for meta in field.metadata:
        func = getattr(meta, "func", None)
        if func is not None and func.__name__ in _VALIDATED:
            return _VALIDATED[func.__name__] + (" or null" if _optional(field.annotation) else "")
    return _annotation_text(field.annotation)


def _optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _annotation_text(annotation: Any) -> str:
    """``list of name``, ``"a" or "b"``, a model as a link to its table.

    >>> _annotation_text(list[int] | None)
    'list of int or null'
    >>> _annotation_text(Literal["hold", "notify"])
    '"hold" or "notify"'
    """
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        metadata = args[1:]
        for meta in metadata:
            func = getattr(meta, "func", None)
            if func is not None and func.__name__ in _VALIDATED:
                return _VALIDATED[func.__name__]
        return _annotation_text(args[0])
    if origin is Literal:
        return " or ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_annotation_text(a) for a in args if a is not type(None)) + (
            " or null" if type(None) in args else ""
        )
    if origin in (list, tuple, set, frozenset):
        return "list of " + _annotation_text(args[0])
    if origin is dict:
        return f"mapping of {_annotation_text(args[0])} to {_annotation_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _anchor_link(annotation)
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "see its table"
        return f"`{value!r}`" if value else "empty"
    value = field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see its table"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if _type_text(field).startswith("size"):
        from changewatch.sources.limits import format_size

        return f"`{format_size(value)}`"
    if isinstance(value, list | dict) and not value:
        return "empty"
    if _type_text(field).startswith("duration"):
        return f"`{value:g}s`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


# --- the command line ------------------------------------------------------------------------


def cli_reference() -> str:
    """The command-line reference page: each command's usage and options, from its parser."""
    # The parser is private to the CLI module (it builds it per call); reading it here keeps
    # one definition of every command, option and help text.
    from changewatch.pipeline.cli.command_line import _parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps usage lines to the terminal
    parser = _parser()
    lines = [
        "# The command line",
        "",
        "Generated from `changewatch`'s argument parser; [Commands](../commands.md) says more",
        "about each. Options of `changewatch` itself go before the command.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        *_options_table(parser),
    ]
    for name, sub in _subcommands(parser):
        summary = sub.description or _help_of(parser, name)
        lines += [f"## changewatch {name}", "", summary[:1].upper() + summary[1:], ""]
        lines += ["```text", sub.format_usage().strip(), "```", "", *_options_table(sub)]
    return "\n".join(lines) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices.items())
    return []


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return (choice.help or "").rstrip(".") + "."
    return ""


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + (action.metavar or action.dest.upper())
        else:
            name = action.metavar or action.dest.upper()
            if action.nargs in ("*", "?"):
                name = f"[{name}...]" if action.nargs == "*" else f"[{name}]"
        choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
        help_text = (action.help or "") % {"default": action.default} + choices
        rows.append(f"| `{name}` | {help_text.replace('|', chr(92) + '|')} |")
    if not rows:
        return []
    return ["| argument | what it does |", "|---|---|", *rows, ""]
