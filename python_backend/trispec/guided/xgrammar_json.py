"""JSON guides as TensorRT-LLM's xgrammar takes them, for llguidance to compile.

TensorRT-LLM compiles NVIDIA's ``json`` guide with ``GrammarCompiler::CompileBuiltinJSONGrammar()`` and
a ``json_schema`` guide with ``CompileJSONSchema(guide)``, every option left at its default
(NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp ``GuidedDecoder::build``). In
xgrammar (v0.1.32, the tag TensorRT-LLM's 3rdparty/fetch_content.json pins; the defaults are the same
since v0.1.8) those defaults are (include/xgrammar/compiler.h, cpp/json_schema_converter.cc,
cpp/grammar.cc):

* ``any_whitespace = true``: ``[ \\n\\t]*`` between JSON tokens (after ``{``/``[``, around ``:`` and
  ``,``, before ``}``/``]``), none before or after the value; the built-in JSON grammar
  (``kJSONGrammarString``: an object or an array) writes its whitespace the same way;
* ``strict_mode = true``: an object schema without ``additionalProperties`` (or
  ``unevaluatedProperties``) takes no property it does not list, an array schema without ``items``
  (or ``unevaluatedItems``) no item beyond its ``prefixItems`` (``SchemaParser::ParseObject`` /
  ``ParseArray``), except the bare ``{"type": "object"}`` and ``{"type": "array"}`` (annotations
  aside), which are any object / any array (``AddBasicRules`` caches them under those keys);
* indent none, separators ``,`` and ``:`` (with the whitespace around them).

llguidance's defaults differ (JSON Schema's: unlisted properties allowed) and it has no strict mode,
so ``strict_schema`` writes strict mode into the schema; its ``whitespace_pattern`` (matched at most
once wherever JSON whitespace may go) gives xgrammar's whitespace.
"""

from __future__ import annotations

from typing import Any

# xgrammar's any_whitespace ([ \n\t]*, no \r), as llguidance's x-guidance options take it
JSON_OPTIONS: dict[str, Any] = {"whitespace_pattern": r"[\x20\x0A\x09]+"}
# keys xgrammar leaves out of a schema's cache key (SchemaParser::ComputeCacheKey kSkippedKeys)
ANNOTATIONS = frozenset(
    {"title", "default", "description", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
    | {"$schema"}
)
ANY_OBJECT, ANY_ARRAY = {"type": "object"}, {"type": "array"}
# where a schema holds other schemas: one, a list of them, or them by name
_ONE = ("additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems", "additionalItems")
_ONE = (*_ONE, "contains", "not", "if", "then", "else", "propertyNames")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def xgrammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema guide as llguidance is to compile it: in strict mode, with xgrammar's whitespace
    unless the schema's own ``x-guidance`` options say how to write whitespace (they win)."""
    own = schema.get("x-guidance")
    own = own if isinstance(own, dict) else {}
    ours = {} if {"whitespace_flexible", "whitespace_pattern"} & own.keys() else JSON_OPTIONS
    return {**strict_schema(schema), "x-guidance": {**ours, **own}}


def strict_schema(schema: Any) -> Any:
    """``schema`` (and every schema inside it) with xgrammar's strict mode written in: an object that
    does not say otherwise gets ``additionalProperties: false``, an array ``items: false``. Where it
    says so with ``unevaluatedProperties`` / ``unevaluatedItems`` (which llguidance does not take),
    that becomes ``additionalProperties`` / ``items``, as xgrammar reads it without them."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(s) for s in out[key]]
    for key in _NAMED:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(s) for name, s in out[key].items()}
    core = {k: v for k, v in out.items() if k not in ANNOTATIONS and k != "x-guidance"}
    if core in (ANY_OBJECT, ANY_ARRAY):
        return out
    kinds = out.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    untyped = out.get("type") is None
    if "object" in kinds or (untyped and any(k in out for k in _NAMED[:2] + _ONE[:2])):
        _close(out, "additionalProperties", "unevaluatedProperties")
    if "array" in kinds or (untyped and any(k in out for k in ("items", "prefixItems", "unevaluatedItems"))):
        _close(out, "items", "unevaluatedItems")
    return out


def _close(schema: dict[str, Any], key: str, unevaluated: str) -> None:
    if key in schema:
        return
    schema[key] = schema.pop(unevaluated) if unevaluated in schema else False
