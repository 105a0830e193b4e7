"""JSON guides take what TensorRT-LLM's xgrammar takes (guided/xgrammar_json.py): TensorRT-LLM
compiles NVIDIA's ``json`` and ``json_schema`` guides with xgrammar's defaults
(batch_manager/guidedDecoder.cpp), ``any_whitespace`` and ``strict_mode`` on. The cases below are read
from xgrammar v0.1.32: its built-in JSON grammar (cpp/grammar.cc ``kJSONGrammarString``: an object or
array, ``[ \\n\\t]*`` between tokens), ``SchemaParser::ParseObject`` / ``ParseArray`` (strict mode:
nothing unlisted unless the schema says so) and ``AddBasicRules`` (the bare object and array types are
any object and any array; tests/python/test_json_schema_converter.py ``test_empty_object``)."""

from __future__ import annotations

import json

import pytest
from tiny import TINY_VOCAB, byte_tokenizer
from trispec.guided import Guide
from trispec.guided.compiler import GrammarCompiler

TOK = byte_tokenizer()
COMPILER = GrammarCompiler(TOK.backend, TOK.eos_ids, TINY_VOCAB)
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}


def takes(guide: Guide, text: str) -> bool:
    """The grammar takes all of ``text`` and may end after it."""
    matcher = COMPILER.compile(guide).new_matcher()
    ids = TOK.encode(text, add_bos=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def schema(value: dict) -> Guide:
    return Guide("json_schema", json.dumps(value))


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ('{"a": 1}', True),
        ('{\n\t"a" : [1, {"b": null}],\n  "c": "d"\n}', True),
        ("[ 1 ,2 ]", True),
        ("{}", True),
        ('{"a":\r1}', False),  # \r is not xgrammar's whitespace
        (' {"a": 1}', False),  # nothing before the value
        ('{"a": 1} ', False),  # nor after it
        ('"just a string"', False),  # an object or an array
    ],
)
def test_the_json_guide_is_xgrammars_builtin_json(text: str, taken: bool) -> None:
    assert takes(Guide("json"), text) is taken
    assert takes(Guide("json_object"), text) is (taken and text.startswith("{"))


@pytest.mark.parametrize(
    ("value", "text", "taken"),
    [
        (POINT, '{"x": 1, "y": 2}', True),
        (POINT, '{ "x" : 1 ,\n "y":2 }', True),
        (POINT, '{"x": 1}', True),  # optional properties stay optional
        (POINT, '{"x": 1, "z": 3}', False),  # not listed: refused
        (POINT, '{"x":1,"z":3}', False),
        (POINT | {"additionalProperties": True}, '{"x": 1, "z": 3}', True),
        (POINT | {"additionalProperties": {"type": "string"}}, '{"x": 1, "z": "s"}', True),
        (POINT | {"additionalProperties": {"type": "string"}}, '{"x": 1, "z": 3}', False),
        (POINT | {"unevaluatedProperties": True}, '{"x": 1, "z": 3}', True),
        ({"type": "object", "properties": {"p": POINT}}, '{"p": {"x": 1, "z": 2}}', False),  # nested too
        ({"type": "array", "items": POINT}, '[{"x": 1}, {"y": 2, "w": 0}]', False),
        ({"type": "object"}, '{"any": [1, "thing"]}', True),  # the bare object: any object
        ({"type": "object", "description": "free"}, '{"any": 1}', True),  # annotations aside
        ({"type": "array"}, '[1, "x", {"k": null}]', True),  # the bare array: any array
        ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1]", True),
        ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1, 2]", False),  # nothing beyond
        ({"type": "array", "prefixItems": [{"type": "integer"}], "items": True}, "[1, 2]", True),
        ({"$defs": {"p": POINT}, "$ref": "#/$defs/p"}, '{"x": 1, "q": 1}', False),  # through a $ref
        ({"anyOf": [POINT, {"type": "integer"}]}, '{"y": 2, "q": 1}', False),
    ],
)
def test_a_json_schema_is_read_in_xgrammars_strict_mode(value: dict, text: str, taken: bool) -> None:
    assert takes(schema(value), text) is taken


def test_a_schemas_own_whitespace_options_win() -> None:
    compact = POINT | {"x-guidance": {"whitespace_flexible": False}}
    assert takes(schema(compact), '{"x":1}') and not takes(schema(compact), '{"x": 1}')


def test_a_structural_tags_json_is_read_the_same_way() -> None:
    tag = {"structures": [{"begin": "<p>", "schema": POINT, "end": "</p>"}], "triggers": ["<p>"]}
    guide = Guide("structural_tag", json.dumps(tag))
    assert takes(guide, 'a <p>{"x": 1, "y": 2}</p> b')
    assert not takes(guide, 'a <p>{"x": 1, "z": 2}</p> b')
