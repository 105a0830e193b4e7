"""OpenAI's ``strict: true`` for a ``json_schema`` response format or a function's ``parameters``.

OpenAI's Structured Outputs take, under ``strict``, a subset of JSON Schema and refuse (400) a schema
outside it (platform.openai.com/docs/guides/structured-outputs, "Supported schemas"): the root is an
object, not ``anyOf``; every object sets ``additionalProperties: false``; every property of an object
is in its ``required`` (an optional field is written as a union with ``null``). The same refusals
here, worded as OpenAI words them. Whatever ``strict`` says, the schema is enforced token by token
(guided decoding), as TensorRT-LLM's xgrammar reads it (docs/openai.md#structured-output).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trispec_openai.errors import OpenAIError, invalid

# where a schema holds others: one schema, a list of them, or them by name
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_MANY = ("anyOf", "allOf", "oneOf", "prefixItems")
_NAMED = ("properties", "$defs", "definitions", "patternProperties")


def strict_flag(spec: dict[str, Any], where: str, param: str) -> bool:
    """``spec["strict"]``: a boolean or absent (False)."""
    strict = spec.get("strict", False)
    if strict is None:
        return False
    if not isinstance(strict, bool):
        raise invalid(f"{where}.strict: must be a boolean, got {strict!r}", param)
    return strict


def check_strict(schema: Any, what: str, param: str) -> None:
    """Refuse (400, ``param``) a schema that OpenAI's strict mode refuses; ``what`` names it as
    OpenAI does (``response_format 'city'``, ``function 'get_weather'``)."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or "anyOf" in schema:
        raise _refused(what, (), "the root must be an object (type 'object'), not anyOf", param)
    for context, node in _subschemas(schema, ()):
        if not _is_object(node):
            continue
        if node.get("additionalProperties") is not False:
            message = "'additionalProperties' is required to be supplied and to be false"
            raise _refused(what, context, message, param)
        properties = node.get("properties", {})
        required = node.get("required", [])
        missing = [key for key in properties if not isinstance(required, list) or key not in required]
        if missing:
            message = (
                "'required' is required to be supplied and to be an array including every key in "
                f"properties. Missing '{missing[0]}'"
            )
            raise _refused(what, context, message, param)


def _is_object(node: dict[str, Any]) -> bool:
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "object" in kinds or (node.get("type") is None and "properties" in node)


def _subschemas(node: Any, context: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every schema inside ``node`` (itself first) with its path, as OpenAI's ``context`` gives it."""
    if not isinstance(node, dict):
        return
    yield context, node
    for key in _ONE:
        yield from _subschemas(node.get(key), (*context, key))
    for key in _MANY:
        subs = node.get(key)
        for i, sub in enumerate(subs if isinstance(subs, list) else ()):
            yield from _subschemas(sub, (*context, key, str(i)))
    for key in _NAMED:
        named = node.get(key)
        for name, sub in named.items() if isinstance(named, dict) else ():
            yield from _subschemas(sub, (*context, key, name))


def _refused(what: str, context: tuple[str, ...], message: str, param: str) -> OpenAIError:
    return invalid(f"Invalid schema for {what}: In context={context!r}, {message}.", param)
