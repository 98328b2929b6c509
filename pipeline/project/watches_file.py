"""The watches file: YAML -> validated settings, with errors that name file, line and key.

Loading is all-or-nothing and happens before anything touches the warehouse, so a bad file
stops definitions from loading and writes nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import duckdb
import yaml
from changewatch.channels.config import (
    ChannelConfig,
    DeliveryConfig,
    DigestConfig,
    EmailChannelConfig,
    FeedbackConfig,
    FileChannelConfig,
)
from changewatch.evaluators.config import LEARNED_MODEL, Watch
from changewatch.evaluators.filters import (
    CompiledFilter,
    FilterError,
    check_filter_runs,
    compile_filter,
)
from changewatch.evaluators.templates import template_problems
from changewatch.pipeline.project.expected_errors import ConfigError, did_you_mean, named
from changewatch.pipeline.project.storage_paths import CONFIG_ENV, DEFAULT_CONFIG, config_path
from changewatch.sources import SourceConfig
from changewatch.sources.base import Duration
from changewatch.sources.fleet import is_fleet, query_problem
from changewatch.sources.polling import polling_problems
from changewatch.sources.webhook import webhook_problems, webhook_provider
from changewatch.warehouse.retention import RetentionConfig
from dagster._utils.schedules import is_valid_cron_string  # the parser Dagster itself uses
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "ConfigError",
    "DEFAULT_BATCH_MAX",
    "DEFAULT_TICK",
    "ChangewatchConfig",
    "PollingConfig",
    "config_path",
    "load_config",
]

# Versions of the watches file format this code reads.
VERSIONS = (1,)

# ${NAME} or ${NAME:-default}: lets non-secret settings (a base URL, a port) vary per machine.
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Seconds between ticks of the sync sensors unless the file's `polling: tick` says.
DEFAULT_TICK = 30.0
DEFAULT_BATCH_MAX = 50


class PollingConfig(BaseModel):
    """How the sensors poll (the watches file's ``polling:`` block)."""

    model_config = ConfigDict(extra="forbid")

    # Seconds between two ticks of the sync sensors (plain sources and fleets): a due source
    # is probed at the first tick of its slot, and the syncs due at one tick share a run. A
    # run costs some 6 core-seconds before its syncs (bench/bench_fleet.py), so with changes
    # at every tick a longer tick starts fewer runs, for up to one tick more of delay.
    # Dagster's daemon looks at sensors every 5 s and gives a tick 60 s to finish.
    tick: Duration = Field(
        default=DEFAULT_TICK,
        ge=5,
        le=3600,
        description=(
            "Time between two ticks of the sync sensors (5s to 1h); the syncs due at one tick "
            "share a run."
        ),
    )
    # The most sources one batched run syncs; more due at one tick make several runs. One run
    # of all of them could go to one worker only, and at 2,000 sources a tick's run held
    # 200-370 sources for two minutes while the other workers' slots waited (bench/README.md,
    # hosts). A run's own start costs about as much as ten syncs, so 50 keeps it a fifth.
    batch_max: int = Field(
        default=DEFAULT_BATCH_MAX,
        ge=1,
        le=10_000,
        description=(
            "The most sources one batched run syncs (1 to 10000); more due at one tick are "
            "split into several runs, which the workers share."
        ),
    )


class ChangewatchConfig(BaseModel):
    """The whole watches file."""

    model_config = ConfigDict(extra="forbid")

    # The file format's version: a file written for another format is refused, not guessed at.
    version: int = Field(default=1, description="The file format's version; only 1 is read.")
    sources: list[Annotated[SourceConfig, Field()]] = Field(
        default_factory=list, description="The APIs to sync, each into a table of its own."
    )
    channels: list[ChannelConfig] = Field(
        default_factory=list,
        description="Where notifications go (console, file, email, webhook, Apprise).",
    )
    watches: list[Watch] = Field(
        default_factory=list,
        description="Which changes of which sources matter, and to which channels they go.",
    )
    digests: list[DigestConfig] = Field(
        default_factory=list,
        description="Periodic emails summarizing the notifications of some watches.",
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig,
        description="How long the warehouse keeps what grows (unset: keep everything).",
    )
    # Signed feedback links in notifications (off without it).
    feedback: FeedbackConfig | None = Field(
        default=None, description="Signed useful/noise links in notifications; off without it."
    )
    # How notifications are delivered: the claim lease after which a send counts as crashed.
    delivery: DeliveryConfig = Field(
        default_factory=DeliveryConfig, description="How notifications are delivered."
    )
    polling: PollingConfig = Field(
        default_factory=PollingConfig, description="How the sync sensors poll."
    )
    _positions: dict[str, int] = PrivateAttr(default_factory=dict)
    _filters: dict[tuple, dict[str, CompiledFilter]] = PrivateAttr(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value not in VERSIONS:
            raise ValueError(
                f"unsupported version {value}: this changewatch reads version "
                + ", ".join(map(str, VERSIONS))
            )
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> ChangewatchConfig:
        for kind, items, attribute in (
            ("sources", self.sources, "name"),
            ("sources", self.sources, "table"),
            ("channels", self.channels, "name"),
            ("watches", self.watches, "name"),
            ("digests", self.digests, "name"),
        ):
            seen: set[str] = set()
            for item in items:
                value = getattr(item, attribute)
                if value in seen:
                    raise ValueError(f"two {kind} share the {attribute} {value!r}")
                seen.add(value)
        return self

    def filters(self, watch: Watch) -> dict[str, CompiledFilter]:
        """The watch's filter compiled against each of its sources' columns (compiled once:
        loading checks them, then wiring uses them, in every run's process)."""
        key = (watch.name, watch.where, tuple(watch.sources))
        if (compiled := self._filters.get(key)) is None:
            compiled = self._filters[key] = {
                name: compile_filter(
                    watch.where,
                    watch=watch.name,
                    columns={c: spec.type for c, spec in self.source(name).columns.items()},
                )
                for name in watch.sources
            }
        return compiled

    def watches_by_source(self) -> dict[str, list[str]]:
        """Each source's name -> the names of the watches that read it."""
        return {
            source.name: [w.name for w in self.watches if source.name in w.sources]
            for source in self.sources
        }

    def headings(self, digest: DigestConfig) -> dict[str, str]:
        """The section headings a digest gives its watches (those that declare one)."""
        return {w.name: w.heading for w in self.watches if w.name in digest.watches and w.heading}

    def channel(self, name: str) -> ChannelConfig:
        """The channel called ``name``."""
        for channel in self.channels:
            if channel.name == name:
                return channel
        raise KeyError(f"no channel {name!r}; known: {[c.name for c in self.channels]}")

    def watch(self, name: str) -> Watch:
        """The watch called ``name``; KeyError names the known ones."""
        for watch in self.watches:
            if watch.name == name:
                return watch
        raise KeyError(f"no watch {name!r}; known: {[w.name for w in self.watches]}")

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``; KeyError names the known ones."""
        # A thousand watches look up a thousand sources: by position, not a scan each. The
        # positions are checked, so a changed list is indexed again, never misread.
        index = self._positions.get(name)
        if index is None or index >= len(self.sources) or self.sources[index].name != name:
            self._positions = {source.name: i for i, source in enumerate(self.sources)}
            index = self._positions.get(name)
        if index is not None:
            return self.sources[index]
        raise KeyError(f"no source {name!r}; known: {[s.name for s in self.sources]}")


def load_config(
    path: str | Path | None = None, *, webhook_secrets: bool = False
) -> ChangewatchConfig:
    """Read, expand and validate the watches file; raise ``ConfigError`` on any problem.

    ``webhook_secrets`` (``changewatch validate``) also checks each source's
    ``webhook.secret_env``: only the receiver reads it, so the other processes need not have it.
    """
    file = config_path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{file}: cannot read the config file: {error.strerror}") from error
    try:
        # libyaml's parser where installed: a thousand sources parse in 0.3 s, not 3.6 s.
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark else str(file)
        raise ConfigError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from error
    if root is None:
        raise ConfigError(f"{file}: the config file is empty")

    problems: list[str] = [f"{file}:{line}" for line in _duplicate_keys(root)]
    if problems:
        # YAML would silently keep the last of two equal keys: half of what was meant.
        raise ConfigError("\n".join(problems))
    data = _expand(_to_python(root), root, file, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        config = ChangewatchConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, root, file)) from None

    for loc, message in _cross_checks(config):
        problems.append(f"{file}:{_line(root, loc)}: {_dotted(_data_loc(root, loc))}: {message}")
    for section, items in (("sources", config.sources), ("channels", config.channels)):
        for index, item in enumerate(items):
            for name in item.env_vars():
                if name not in os.environ:
                    loc = (section, index, *_env_key_path(root, section, index, name))
                    problems.append(
                        f"{file}:{_line(root, loc)}: {_dotted(loc)}: environment variable "
                        f"{name} is not set"
                    )
    # An empty secret would sign links anyone can forge.
    if config.feedback is not None and not os.environ.get(config.feedback.secret_env, "").strip():
        loc = ("feedback", "secret_env")
        problems.append(
            f"{file}:{_line(root, loc)}: {_dotted(loc)}: environment variable "
            f"{config.feedback.secret_env} (the feedback links' signing secret) is not set"
        )
    for index, source in enumerate(config.sources if webhook_secrets else []):
        if source.webhook is not None and (why := _webhook_secret_problem(source)):
            loc = ("sources", index, "webhook", "secret_env")
            problems.append(f"{file}:{_line(root, loc)}: {_dotted(loc)}: {why}")
    # A local judge that cannot run (extra or model file missing) is not a problem of the
    # file: only its watches fail, each when it is evaluated (`validate` names them).
    for index, watch in enumerate(config.watches):
        for name in watch.judge.env_vars() if watch.judge else []:
            if name not in os.environ:
                loc = ("watches", index, "judge", "api_key_env")
                problems.append(
                    f"{file}:{_line(root, loc)}: {_dotted(loc)}: environment variable "
                    f"{name} is not set"
                )
    if problems:
        raise ConfigError("\n".join(problems))
    return _anchor_paths(config, file.resolve().parent)


def _webhook_secret_problem(source: SourceConfig) -> str | None:
    """Why `changewatch webhooks` would refuse to start on ``source``'s secret, if it would."""
    from changewatch.channels.webhook_signatures import signing_key

    name = source.webhook.secret_env
    if not os.environ.get(name, "").strip():
        return f"environment variable {name} is not set (`changewatch webhooks` needs it)"
    try:
        signing_key(webhook_provider(source.type, source.webhook), os.environ[name])
    except ValueError as error:
        return f"environment variable {name}: {error}"
    return None


def _anchor_paths(config: ChangewatchConfig, base: Path) -> ChangewatchConfig:
    """Relative output paths mean relative to the watches file, not to wherever a process
    (the CLI, the Dagster daemon, a test) happens to start."""

    def anchored(path: str) -> str:
        return str(base / path) if not Path(path).expanduser().is_absolute() else path

    for channel in config.channels:
        if isinstance(channel, FileChannelConfig):
            channel.path = anchored(channel.path)
    for digest in config.digests:
        if digest.output_dir is not None:
            digest.output_dir = anchored(digest.output_dir)
    return config


def _cross_checks(config: ChangewatchConfig) -> list[tuple[tuple, str]]:
    """References between sections, and every watch's filter against its sources."""
    sources = {s.name for s in config.sources}
    channels = {c.name: c for c in config.channels}
    watches = {w.name for w in config.watches}
    tables = {s.table for s in config.sources}
    problems: list[tuple[tuple, str]] = []
    for i, source in enumerate(config.sources):
        for key in ("cron", "reconcile"):
            value = getattr(source, key)
            if value is not None and not is_valid_cron_string(value):
                problems.append((("sources", i, key), f"{value!r} is not a valid cron schedule"))
        if is_fleet(source) and source.name == "sources":
            # Its job, sync_<fleet>, would be the job of every plain source
            # (pipeline/triggers/sync_sensors.py).
            message = "a fleet cannot be named 'sources': sync_sources is the job of plain sources"
            problems.append((("sources", i, "name"), message))
        # A fleet's targets query reads the file's synced tables only (sources/fleet.py).
        if (found := query_problem(source, tables)) is not None:
            problems.append((("sources", i, *found[0]), found[1]))
    problems += webhook_problems(config.sources)
    problems += polling_problems(config.sources)
    if not is_valid_cron_string(config.retention.cron):
        problems.append(
            (("retention", "cron"), f"{config.retention.cron!r} is not a valid cron schedule")
        )
    for channel in config.channels:
        # A send still under way when its claim expires would be taken for a crashed one.
        timeout = getattr(channel, "timeout", None)
        if timeout is not None and config.delivery.lease < 2 * timeout:
            problems.append(
                (
                    ("delivery", "lease"),
                    f"the lease ({config.delivery.lease:g}s) must be at least twice the "
                    f"timeout of channel {channel.name!r} ({timeout:g}s): a slower send would "
                    "pass for one a crash cut short; raise delivery.lease or lower the timeout",
                )
            )
    for i, digest in enumerate(config.digests):
        if not is_valid_cron_string(digest.cron):
            problems.append(
                (("digests", i, "cron"), f"{digest.cron!r} is not a valid cron schedule")
            )
    with duckdb.connect() as filter_check:  # one for every filter: see check_filter_runs
        problems += _watch_problems(config, sources, channels, filter_check)
    for i, digest in enumerate(config.digests):
        for j, name in enumerate(digest.watches):
            if name not in watches:
                problems.append((("digests", i, "watches", j), _unknown("watch", name, watches)))
        if digest.channel is not None:
            channel = channels.get(digest.channel)
            if channel is None:
                unknown = _unknown("channel", digest.channel, channels)
                problems.append((("digests", i, "channel"), unknown))
            elif not isinstance(channel, EmailChannelConfig):
                problems.append(
                    (
                        ("digests", i, "channel"),
                        f"channel {digest.channel!r} is not an email channel",
                    )
                )
    return problems


def _unknown(kind: str, name: str, known: Iterable[str]) -> str:
    """``unknown source 'x'``, the nearest known name, and the known ones.

    >>> _unknown("source", "demo_isues", ["demo_issues", "releases"])
    "unknown source 'demo_isues'; did you mean 'demo_issues'? (known: demo_issues, releases)"
    """
    names = sorted(known)
    return f"unknown {kind} {name!r}{did_you_mean(name, names)} (known: {named(names)})"


def _watch_problems(
    config: ChangewatchConfig,
    sources: set[str],
    channels: Mapping[str, Any],
    filter_check: duckdb.DuckDBPyConnection,
) -> list[tuple[tuple, str]]:
    """Each watch's sources and channels known, its templates' names, its filters run."""
    problems: list[tuple[tuple, str]] = []
    for i, watch in enumerate(config.watches):
        for j, name in enumerate(watch.sources):
            if name not in sources:
                problems.append((("watches", i, "sources", j), _unknown("source", name, sources)))
        for j, name in enumerate(watch.channels):
            if name not in channels:
                where = ("watches", i, "channels", j)
                problems.append((where, _unknown("channel", name, channels)))
        for k, judge in enumerate(watch.judge.judges() if watch.judge is not None else []):
            if judge.model == LEARNED_MODEL and judge.retrain is not None and (
                not is_valid_cron_string(judge.retrain)
            ):
                # The k-th judge of `judge: [...]`; written as a mapping, the line of `judge`.
                message = f"{judge.retrain!r} is not a valid cron schedule"
                problems.append((("watches", i, "judge", k, "retrain"), message))
        if all(name in sources for name in watch.sources):
            problems += _template_problems(config, i, watch)
            try:
                for name, compiled in config.filters(watch).items():
                    columns = {c: spec.type for c, spec in config.source(name).columns.items()}
                    check_filter_runs(compiled, columns, filter_check)
            except FilterError as error:
                # The location names the key already: "watches[i].where: watch 'x': ...".
                problems.append(
                    (("watches", i, "where"), f"watch {error.watch!r}: {error.problem}")
                )
    return problems


def _template_problems(
    config: ChangewatchConfig, index: int, watch: Watch
) -> list[tuple[tuple, str]]:
    """Names in the watch's templates that no notification of its sources has."""
    problems: list[tuple[tuple, str]] = []
    # Only templates the file sets: the default url tries columns a source may lack.
    for field in sorted({"title", "body", "url"} & watch.model_fields_set):
        for name in watch.sources:
            columns = list(config.source(name).columns)
            for message in template_problems(getattr(watch, field), name, columns):
                if (loc := ("watches", index, field), message) not in problems:
                    problems.append((loc, message))
    return problems


def _duplicate_keys(node: yaml.Node, loc: tuple = ()) -> list[str]:
    """``line: key: duplicate key 'x' (first at line n)`` for each key repeated in a mapping."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.value in first:
                problems.append(
                    f"{line}: {_dotted((*loc, key.value))}: duplicate key {key.value!r} "
                    f"(first at line {first[key.value]})"
                )
            first.setdefault(key.value, line)
            problems += _duplicate_keys(value, (*loc, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems += _duplicate_keys(item, (*loc, index))
    return problems


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
        loc = _without_union_tag(root, tuple(item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            keys = _keys_at(ChangewatchConfig, tuple(item["loc"])[:-1])
            message = f"unknown key {loc[-1]!r}{did_you_mean(str(loc[-1]), keys)}"
        lines.append(f"{file}:{_line(root, loc)}: {_dotted(_data_loc(root, loc))}: {message}")
    return "\n".join(lines)


def _keys_at(model: Any, loc: tuple) -> list[str]:
    """The keys the settings at ``loc`` (a pydantic location) take, read from the models'
    fields, so a field added to any of them is suggested with no list to keep.

    >>> "paginator" in _keys_at(ChangewatchConfig, ("sources", 0, "rest"))
    True
    >>> _keys_at(ChangewatchConfig, ("polling",))
    ['batch_max', 'tick']
    """
    kinds = [model]
    for part in loc:
        kinds = [found for kind in kinds for found in _step(kind, part)]
    return sorted(
        {
            field.alias or name
            for kind in kinds
            if isinstance(kind, type) and issubclass(kind, BaseModel)
            for name, field in kind.model_fields.items()
        }
    )


def _step(kind: Any, part: str | int) -> list[Any]:
    """The types one step of a pydantic location leads to from ``kind``."""
    found = []
    for member in _members(kind):
        if isinstance(member, type) and issubclass(member, BaseModel):
            fields = {field.alias or name: field for name, field in member.model_fields.items()}
            if part in fields:
                found += _members(fields[part].annotation)
            elif part == member.__name__ or any(
                part in get_args(field.annotation)
                for field in fields.values()
                if get_origin(field.annotation) is Literal
            ):  # the tag of a union's member: the member itself
                found.append(member)
        elif get_origin(member) in (list, tuple, set, frozenset) and isinstance(part, int):
            found += [m for arg in get_args(member) for m in _members(arg)]
        elif get_origin(member) is dict and isinstance(part, str):
            found += _members(get_args(member)[1])
    return found


def _members(kind: Any) -> list[Any]:
    """``kind`` without Annotated and None, a union as its members."""
    if get_origin(kind) is Annotated:
        return _members(get_args(kind)[0])
    if get_origin(kind) in (Union, UnionType):
        return [m for arg in get_args(kind) if arg is not type(None) for m in _members(arg)]
    return [kind]


def _without_union_tag(root: yaml.Node, loc: tuple) -> tuple:
    """Drop the member tag pydantic puts in locations inside a discriminated union.

    ``('sources', 1, 'feed', 'url')`` names the ``url`` of ``sources[1]``, whose type is feed.
    """
    for index in range(1, len(loc)):
        node, path = _walk(root, loc[:index])
        if path == loc[:index] and isinstance(node, yaml.MappingNode):
            kind = next((v.value for k, v in node.value if k.value == "type"), None)
            if kind == loc[index]:
                return loc[:index] + loc[index + 1 :]
    return loc


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


def _env_key_path(root: yaml.Node, section: str, index: int, name: str) -> tuple:
    """Path under ``section[index]`` of the scalar whose value is the env var ``name``."""

    def search(node: yaml.Node, path: tuple) -> tuple | None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(value, yaml.ScalarNode) and value.value == name:
                    return (*path, key.value)
                found = search(value, (*path, key.value))
                if found:
                    return found
        return None

    node, _ = _walk(root, (section, index))
    return search(node, ()) or ()
