"""A minimal JSON instance of a JSON Schema: the echo engine's structured output.

The echo engine has no model to guide, so for a ``response_format`` it answers the
smallest value it can build from the schema — required properties only, ``minItems``
items, the first ``enum``/``const`` value, the lowest number in range, ``minLength``
characters — and then checks that value with ``jsonschema``. A schema whose instance it
cannot build (a ``pattern``, a ``not``, contradictory bounds…) is refused, naming the
problem, just as a grammar compiler refuses what it cannot compile.
"""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema

from worker.errors import BatchpipeError


class NoInstance(BatchpipeError, ValueError):
    """No minimal instance of the schema could be built; the message says why."""


def _resolve(schema: Any, root: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > 32:
        raise NoInstance("the schema nests or refers to itself too deeply")
    if schema is True or schema == {}:
        return {}
    if not isinstance(schema, dict):
        raise NoInstance(f"{schema!r} admits no value")
    ref = schema.get("$ref")
    if ref is None:
        return schema
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise NoInstance(f"only local references (#/...) are followed, not {ref!r}")
    target: Any = root
    for part in ref[2:].split("/"):
        target = target.get(part.replace("~1", "/").replace("~0", "~"), None)
        if target is None:
            raise NoInstance(f"reference {ref} points nowhere")
    return _resolve(target, root, depth + 1)


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    value: float = 0 if low is None else low
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        value = schema["exclusiveMinimum"] + (1 if integer else 1e-6)
    if high is not None and low is None and value > high:
        value = high if "maximum" in schema else high - (1 if integer else 1e-6)
    if integer:
        value = math.ceil(value)
    return int(value) if integer else float(value)


def _value(schema: Any, root: dict[str, Any], depth: int) -> Any:
    node = _resolve(schema, root, depth)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        if not node["enum"]:
            raise NoInstance("an empty enum admits no value")
        return node["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if node.get(key):
            return _value(node[key][0], root, depth + 1)
    kind = node.get("type", "object" if "properties" in node else "null")
    if isinstance(kind, list):
        kind = kind[0] if kind else "null"
    if kind == "object":
        properties = node.get("properties", {})
        return {
            name: _value(properties.get(name, {}), root, depth + 1)
            for name in node.get("required", [])
        }
    if kind == "array":
        return [_value(node.get("items", {}), root, depth + 1)] * int(node.get("minItems", 0))
    if kind == "string":
        return "a" * int(node.get("minLength", 0))
    if kind in ("integer", "number"):
        return _number(node, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    raise NoInstance(f"unknown type {kind!r}")


def minimal_instance(schema: dict[str, Any]) -> Any:
    """The minimal value of ``schema``, checked against it; :class:`NoInstance` otherwise."""
    value = _value(schema, schema, 0)
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(value)
    )
    if error is not None:
        raise NoInstance(f"the minimal value {json.dumps(value)} fails the schema: {error.message}")
    return value
