"""The report's JSON Schema and a validator for the subset of JSON Schema it uses.

Written here rather than depending on ``jsonschema``: images hold only what they need.
Supported keywords: type, const, enum, pattern, minimum, maximum, required, properties,
additionalProperties (bool or schema), items.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def _is_type(value: object, name: str) -> bool:
    # bool is an int in Python but not an integer or number in JSON Schema.
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[name])


def validate(instance: object, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every violation as ``path: message``; an empty list means valid."""
    errors = _check_scalar_keywords(instance, schema, path)
    if errors:
        return errors
    if isinstance(instance, dict):
        errors.extend(_check_object(instance, schema, path))
    if isinstance(instance, list) and "items" in schema:
        for index, item in enumerate(instance):
            errors.extend(validate(item, schema["items"], f"{path}[{index}]"))
    return errors


def _check_scalar_keywords(instance: object, schema: dict[str, Any], path: str) -> list[str]:
    wanted = schema.get("type")
    if wanted is not None:
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        if not any(_is_type(instance, name) for name in names):
            return [f"{path}: expected {'/'.join(names)}, got {type(instance).__name__}"]
    if "const" in schema and instance != schema["const"]:
        return [f"{path}: expected {schema['const']!r}, got {instance!r}"]
    if "enum" in schema and instance not in schema["enum"]:
        return [f"{path}: {instance!r} is not one of {schema['enum']}"]
    pattern = schema.get("pattern")
    if isinstance(instance, str) and pattern and re.search(pattern, instance) is None:
        return [f"{path}: {instance!r} does not match {schema['pattern']}"]
    numeric = isinstance(instance, (int, float)) and not isinstance(instance, bool)
    if numeric and "minimum" in schema and instance < schema["minimum"]:
        return [f"{path}: {instance} < minimum {schema['minimum']}"]
    if numeric and "maximum" in schema and instance > schema["maximum"]:
        return [f"{path}: {instance} > maximum {schema['maximum']}"]
    return []


def _check_object(instance: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    errors = [
        f"{path}: missing {key!r}" for key in schema.get("required", ()) if key not in instance
    ]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, value in instance.items():
        if key in properties:
            errors.extend(validate(value, properties[key], f"{path}.{key}"))
        elif extra is False:
            errors.append(f"{path}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            errors.extend(validate(value, extra, f"{path}.{key}"))
    return errors
