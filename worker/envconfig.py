"""Configuration from ``BATCHPIPE_*`` environment variables (docs/architecture.md §6).

A configuration variable names its setting's path with double underscores:
``BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS`` is ``kafka.bootstrap_servers``. Only those are
configuration. The prefix is shared with variables that are not settings but that
settings *name* — ``BATCHPIPE_REMOTE_API_KEY`` (the default of
``engine.remote.api_key_env``), a webhook's ``secret_env``, ``BATCHPIPE_API_KEYS`` — and
with tools' own (``BATCHPIPE_CHAOS_REPORT``): a variable without a double underscore is
left alone, unless it reads as a setting spelt with single underscores
(``BATCHPIPE_KAFKA_BOOTSTRAP_SERVERS``), which is refused with the spelling meant: the
user set it to configure something, and ignoring it would run with the default.

Every problem names its variable; :func:`env_settings` returns, beside the settings,
which variable set each path, so that a value the schema refuses names its variable too.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "BATCHPIPE_"

Path = tuple[str, ...]


@dataclass(frozen=True)
class EnvSettings:
    """The settings the environment sets, and the variable that set each path."""

    doc: Mapping[str, Any]
    origins: Mapping[Path, str]
    problems: tuple[str, ...]


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: Mapping[str, Any] = schema["$defs"][ref.removeprefix("#/$defs/")]
        return resolved
    return node


def _is_mapping(node: Mapping[str, Any]) -> bool:
    """A setting whose keys are the user's (``kafka.client``, ``kafka.routes``, …)."""
    extra = node.get("additionalProperties", False)
    return extra is not False and not node.get("properties")


def _path_problem(schema: Mapping[str, Any], path: list[str]) -> str | None:
    """Why ``path`` is no setting (with the closest names), None when it is one."""
    node: Mapping[str, Any] = schema
    for depth, part in enumerate(path):
        if _is_mapping(node):
            return None  # a key of the user's own (a librdkafka name, a model)
        if depth and "properties" not in node:
            above = path[:depth]
            return (
                f"{'.'.join(above)} is one value, not a group of settings: set "
                f"{variable_name(above)}"
            )
        props: Mapping[str, Any] = node.get("properties", {})
        if part not in props:
            where = ".".join(path[:depth]) or "the configuration"
            close = difflib.get_close_matches(part, list(props), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            return f"{where} has no setting {part!r}{hint} (its settings: {', '.join(props)})"
        node = _resolve(schema, props[part])
    return None


def _spelling(schema: Mapping[str, Any], rest: str) -> list[str] | None:
    """``kafka_bootstrap_servers`` read as a setting's path spelt with single underscores
    (``["kafka", "bootstrap_servers"]``), None when it reads as none."""

    def walk(node: Mapping[str, Any], text: str) -> list[str] | None:
        if _is_mapping(node):
            return [text]
        props: Mapping[str, Any] = node.get("properties", {})
        for key in sorted(props, key=len, reverse=True):  # the longest name first
            if text == key and not _resolve(schema, props[key]).get("properties"):
                return [key]
            if text.startswith(key + "_"):
                below = walk(_resolve(schema, props[key]), text[len(key) + 1 :])
                if below is not None:
                    return [key, *below]
        return None

    return walk(schema, rest)


def short(exc: BaseException | str, most: int = 200) -> str:
    """``exc``'s message, cut to ``most`` characters (a value may be 100 KB long)."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= most else text[:most] + "..."


def variable_name(path: list[str]) -> str:
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def env_settings(
    environ: Mapping[str, str],
    schema: Mapping[str, Any],
    parse: Any,
    skip: frozenset[str] = frozenset(),
) -> EnvSettings:
    """The settings ``environ``'s configuration variables give (``parse`` turns a raw value
    into a YAML scalar), ignoring the names in ``skip``; problems name their variable."""
    doc: dict[str, Any] = {}
    origins: dict[Path, str] = {}
    problems: list[str] = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in skip:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        if "__" not in rest:
            meant = _spelling(schema, rest)
            if meant is not None and len(meant) > 1:
                problems.append(
                    f"environment {name}: nested settings take a double underscore: did you "
                    f"mean {variable_name(meant)} ({'.'.join(meant)})?"
                )
            continue  # not configuration: a secret a setting names, or another tool's
        path = rest.split("__")
        problem = _path_problem(schema, path)
        if problem is not None:
            problems.append(f"environment {name}: {problem}")
            continue
        try:
            value: Any = parse(raw)
        except (ValueError, RecursionError) as exc:
            # YAML's own: an integer of more than 4,300 digits, a value nested too deep
            problems.append(f"environment {name}: its value cannot be read: {short(exc)}")
            continue
        # kafka.client keys are librdkafka names ("security.protocol"): "_" stands for ".";
        # their values stay strings, as librdkafka takes them (a password "123456" is text)
        if len(path) == 3 and path[:2] == ["kafka", "client"]:
            path[2] = path[2].replace("_", ".")
            value = raw
        node = doc
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"environment {name}: {'.'.join(path)} is set twice")
                break
            node = child
        else:
            node[path[-1]] = value
            origins[tuple(path)] = name
    return EnvSettings(doc, origins, tuple(problems))


def origin_of(path: Path, origins: Mapping[Path, str]) -> str | None:
    """The variable that set ``path`` or a setting above or below it, None if none did."""
    for length in range(len(path), 0, -1):
        if path[:length] in origins:
            return origins[path[:length]]
    below = [name for set_path, name in origins.items() if set_path[: len(path)] == path]
    return below[0] if len(below) == 1 else None
