"""The watches file: YAML -> validated settings, with errors that name file, line and key.

Loading is all-or-nothing and happens before anything touches the warehouse, so a bad file
stops definitions from loading and writes nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sources import SourceConfig

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "ConfigError",
    "WatchConfig",
    "config_path",
    "load_config",
]

CONFIG_ENV = "CHANGEWATCH_CONFIG"
DEFAULT_CONFIG = "watches.yaml"

# ${NAME} or ${NAME:-default}: lets non-secret settings (a base URL, a port) vary per machine.
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """The watches file is invalid; the message lists every problem as ``file:line: key: why``."""


class WatchConfig(BaseModel):
    """The whole watches file."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    sources: list[Annotated[SourceConfig, Field()]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> WatchConfig:
        for attribute in ("name", "table"):
            seen: set[str] = set()
            for source in self.sources:
                value = getattr(source, attribute)
                if value in seen:
                    raise ValueError(f"two sources share the {attribute} {value!r}")
                seen.add(value)
        return self

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``; KeyError names the known ones."""
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(f"no source {name!r}; known: {[s.name for s in self.sources]}")


def config_path(path: str | Path | None = None) -> Path:
    """The watches file to use: ``path``, else ``$CHANGEWATCH_CONFIG``, else ``watches.yaml``."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str | Path | None = None) -> WatchConfig:
    """Read, expand and validate the watches file; raise ``ConfigError`` on any problem."""
    file = config_path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{file}: cannot read the config file: {error.strerror}") from error
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark else str(file)
        raise ConfigError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from error
    if root is None:
        raise ConfigError(f"{file}: the config file is empty")

    problems: list[str] = []
    data = _expand(_to_python(root), root, file, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        config = WatchConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, root, file)) from None

    for index, source in enumerate(config.sources):
        for name in source.env_vars():
            if name not in os.environ:
                loc = ("sources", index, *_env_key_path(root, index, name))
                problems.append(
                    f"{file}:{_line(root, loc)}: {_dotted(loc)}: environment variable "
                    f"{name} is not set"
                )
    if problems:
        raise ConfigError("\n".join(problems))
    return config


def _to_python(node: yaml.Node) -> Any:
    # Build plain data from the composed tree, so values and line numbers come from one parse.
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expand(value: Any, root: yaml.Node, file: Path, problems: list[str], loc: tuple = ()) -> Any:
    """Replace ${VAR} references in strings; a missing variable without default is a problem."""
    if isinstance(value, dict):
        return {k: _expand(v, root, file, problems, (*loc, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, root, file, problems, (*loc, i)) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        problems.append(
            f"{file}:{_line(root, loc)}: {_dotted(loc)}: environment variable {name} is not set"
        )
        return match.group(0)

    return _ENV_REF.sub(substitute, value)


def _describe(error: ValidationError, root: yaml.Node, file: Path) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}"
        lines.append(f"{file}:{_line(root, loc)}: {_dotted(_data_loc(root, loc))}: {message}")
    return "\n".join(lines)


def _walk(root: yaml.Node, loc: tuple) -> tuple[yaml.Node, tuple]:
    """Deepest node along ``loc`` and the path that reached it (skipping pydantic's union tags)."""
    node, path = root, ()
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is None:
                continue  # a step only pydantic knows, such as a union member's tag
            key, value = pair
            # A scalar is reported at its key; a nested block at its own first line.
            node, path = (key if isinstance(value, yaml.ScalarNode) else value), (*path, part)
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node, path = node.value[part], (*path, part)
    return node, path


def _line(root: yaml.Node, loc: tuple) -> int:
    node, _ = _walk(root, loc)
    return node.start_mark.line + 1


def _data_loc(root: yaml.Node, loc: tuple) -> tuple:
    # Keep the keys the user wrote and the key pydantic complains about, even if missing.
    _, path = _walk(root, loc)
    tail = loc[-1:] if loc and (not path or path[-1] != loc[-1]) else ()
    return (*path, *tail)


def _dotted(loc: tuple) -> str:
    """``sources[0].auth.token_env`` style text of a location.

    >>> _dotted(("sources", 0, "auth", "token_env"))
    'sources[0].auth.token_env'
    """
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _env_key_path(root: yaml.Node, index: int, name: str) -> tuple:
    """Path under ``sources[index]`` of the scalar whose value is the env var ``name``."""

    def search(node: yaml.Node, path: tuple) -> tuple | None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(value, yaml.ScalarNode) and value.value == name:
                    return (*path, key.value)
                found = search(value, (*path, key.value))
                if found:
                    return found
        return None

    node, _ = _walk(root, ("sources", index))
    return search(node, ()) or ()
