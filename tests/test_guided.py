"""Guided decoding on the torch runner, with tiny random models: under a grammar even a random model's
answer must parse and validate, and speculation must not change it (greedy and seeded, k 0/4/8,
alone and batched with unguided requests)."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import numpy as np
import pytest
import torch
from tiny import byte_tokenizer, model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.ngram import NgramDrafter
from trispec.engine.base import ForwardInput
from trispec.errors import InvalidInputError
from trispec.guided import Guide
from trispec.guided.compiler import GrammarCompiler, llg_tokenizer
from trispec.guided.xgrammar_json import xgrammar_schema
from trispec.request import GenerationRequest
from trispec.sequence import FinishReason

STR = {"type": "string", "maxLength": 5}
# JSON without whitespace, as a schema may ask (its own x-guidance options): under xgrammar's
# whitespace (the default, tests/test_guided_json.py) a random model pads its answers forever
COMPACT = {"x-guidance": {"whitespace_flexible": False}}
# a structural tag: one call of w with a city, after the trigger <fn= in free text
CITY_ONLY = {
    **COMPACT,
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
TAG = {"structures": [{"begin": "<fn=w>", "schema": CITY_ONLY, "end": "</fn>"}], "triggers": ["<fn="]}
SCHEMAS: list[dict] = [
    {  # nested objects, optional fields
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": STR, "nick": STR},
                "required": ["name"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    {  # arrays with bounds
        "type": "object",
        "properties": {
            "ids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["ids"],
        "additionalProperties": False,
    },
    {  # enums
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    {  # patterns
        "type": "object",
        "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
        },
        "required": ["zip", "code"],
        "additionalProperties": False,
    },
    {  # integers with ranges
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "delta": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["age", "delta"],
        "additionalProperties": False,
    },
    {  # optional fields only
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
        "additionalProperties": False,
    },
    {  # an array of objects
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"k": {"enum": ["p", "q"]}, "v": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["k", "v"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {  # anyOf / const / null
        "type": "object",
        "properties": {"kind": {"const": "tool"}, "arg": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}},
        "required": ["kind", "arg"],
        "additionalProperties": False,
    },
]
SCHEMAS = [{**COMPACT, **schema} for schema in SCHEMAS]
PROMPTS = ["Give me JSON:", "answer", "q?", "{", "data please", "x", "Return an object", "tool call"]


def _guided(i: int, schema: dict, **kw: object) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPTS[i % len(PROMPTS)], max_tokens=80, guide=Guide("json_schema", json.dumps(schema)), **kw
    )


def _texts(k: int, temperature: float, with_unguided: bool) -> tuple[list[str], list[str], list[str]]:
    llm = spec_engine(tiny_engine(0), model_drafter(1), max_num_draft_tokens=8)
    sampled = {"temperature": temperature, "seed": 11} if temperature else {}
    guided = [llm.add_request(_guided(i, s, num_draft_tokens=k, **sampled)) for i, s in enumerate(SCHEMAS)]
    plain = []
    if with_unguided:
        plain = [
            llm.add_request(GenerationRequest(prompt=p, max_tokens=24, num_draft_tokens=k, **sampled))
            for p in ("free text", "more")
        ]
    outs = run_to_completion(llm)
    text = {rid: "".join(o.new_text for o in outs[rid]) for rid in guided + plain}
    reasons = [outs[rid][-1].finish_reason.value for rid in guided]
    return [text[r] for r in guided], [text[r] for r in plain], reasons


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
def test_every_answer_validates_and_is_the_same_whatever_k_and_batch(temperature: float) -> None:
    alone = [_texts(0, temperature, with_unguided=False)[0]]
    runs = [_texts(k, temperature, with_unguided=True) for k in (0, 4, 8)]
    for texts, _, reasons in runs:
        assert texts == alone[0]
        assert reasons == ["stop"] * len(SCHEMAS)
    assert runs[0][1] == runs[1][1] == runs[2][1]  # the unguided requests beside them too
    for schema, text in zip(SCHEMAS, alone[0]):
        jsonschema.validate(json.loads(text), schema)


def _reference_guided_greedy(prompt: list[int], schema: dict, max_tokens: int) -> list[int]:
    """Target-only greedy under the grammar, straight from llguidance and the engine: one forward per
    token, argmax over the allowed tokens (the tokenizer has no end token: one is added, as ours)."""
    tok = byte_tokenizer()
    engine = tiny_engine(0)
    llt = llg_tokenizer(tok.backend, frozenset(), engine.vocab_size)
    matcher = llguidance.LLMatcher(
        llt, llguidance.LLMatcher.grammar_from_json_schema(xgrammar_schema(schema))
    )
    engine.add_sequence(0, len(prompt) + max_tokens)
    logits = engine.forward([ForwardInput(0, prompt, 1)])[0][-1]
    out: list[int] = []
    while len(out) < max_tokens and not matcher.is_stopped():
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits[: engine.vocab_size].astype(bool))
        token = int(torch.argmax(logits.masked_fill(~allowed, -torch.inf)))
        assert matcher.consume_token(token)
        out.append(token)
        logits = engine.forward([ForwardInput(0, [token], 1)])[0][-1]
    return out


def test_greedy_guided_equals_target_only_greedy_under_the_grammar() -> None:
    prompt = byte_tokenizer().encode("Give me JSON:")
    for schema in SCHEMAS[:2]:
        llm = spec_engine(tiny_engine(0), model_drafter(1))
        guide = Guide("json_schema", json.dumps(schema))
        rid = llm.add_request(
            GenerationRequest(prompt_token_ids=prompt, max_tokens=80, num_draft_tokens=4, guide=guide)
        )
        assert tokens_of(run_to_completion(llm)[rid]) == _reference_guided_greedy(prompt, schema, 80)


def _one(guide: Guide, k: int = 4, drafter: object = "model", **kw: object) -> tuple[str, object]:
    drafter = model_drafter(1) if drafter == "model" else drafter
    k = k if drafter is not None else 0
    llm = spec_engine(tiny_engine(0), drafter)
    kw.setdefault("max_tokens", 60)
    rid = llm.add_request(GenerationRequest(prompt="go", num_draft_tokens=k, guide=guide, **kw))
    outs = run_to_completion(llm)[rid]
    return "".join(o.new_text for o in outs), outs[-1]


@pytest.mark.parametrize(
    ("guide", "pattern"),
    [
        (Guide("regex", r"(yes|no), [0-9]{3}"), r"(yes|no), [0-9]{3}"),
        (
            Guide("ebnf_grammar", 'root ::= "call(" arg ")"\narg ::= [a-c] [a-c]? | "none"'),
            r"call\(([a-c]{1,2}|none)\)",
        ),
        (Guide("ebnf_grammar", 'start: "x=" NUM\nNUM: /[0-9]{1,3}/'), r"x=[0-9]{1,3}"),  # Lark
    ],
)
def test_regex_and_grammars_shape_the_text_with_any_drafter(guide: Guide, pattern: str) -> None:
    texts = {
        name: _one(guide, drafter=d)[0]
        for name, d in (("model", "model"), ("ngram", NgramDrafter(320)), ("none", None))
    }
    assert len(set(texts.values())) == 1, texts
    assert re.fullmatch(pattern, texts["model"]), texts["model"]


def test_json_and_json_object_give_a_complete_object_with_members_whatever_k() -> None:
    """A bias toward '"' has the random model open a key rather than close an empty object at once:
    the answer (xgrammar's whitespace and all) is complete JSON with a member, the same whatever k."""
    quote = byte_tokenizer().encode('"', add_bos=False)[0]
    for kind, types in (("json", (dict, list)), ("json_object", (dict,))):
        runs = [
            _one(Guide(kind), k=k, max_tokens=200, temperature=0.7, seed=5, logit_bias={quote: 4.0})
            for k in (0, 4)
        ]
        (text, last), (same, _) = runs
        assert same == text and last.finish_reason is FinishReason.STOP, runs
        value = json.loads(text)
        assert isinstance(value, types) and len(value) >= 1, text


def test_max_tokens_mid_structure_ends_with_length() -> None:
    text, last = _one(Guide("json_schema", json.dumps(SCHEMAS[0])), max_tokens=5)
    assert last.finish_reason is FinishReason.LENGTH
    assert len(text) > 0


def test_a_complete_grammar_with_no_end_id_ends_the_request() -> None:
    text, last = _one(Guide("regex", "abc"), end_id=-1, max_tokens=50)
    assert (text, last.finish_reason) == ("abc", FinishReason.STOP)


@pytest.mark.parametrize(
    ("guide", "field", "reason"),
    [
        (Guide("json_schema", "{not json"), "guided_decoding_guide", "not valid JSON"),
        (Guide("json_schema", '{"type": "nosuch"}'), "guided_decoding_guide", "nosuch"),
        (Guide("regex", "a[b"), "guided_decoding_guide", "unclosed character class"),
        (Guide("ebnf_grammar", 'root ::= "a" missing'), "guided_decoding_guide", "missing"),
        (Guide("json_schema", "[1, 2]", field="response_format"), "response_format", "JSON object"),
        (Guide("structural_tag", "{not json"), "guided_decoding_guide", "structural tag is not valid JSON"),
        (
            Guide("structural_tag", '{"structures": [], "triggers": ["<f"]}'),
            "guided_decoding_guide",
            "non-empty",
        ),
        (
            Guide(
                "structural_tag",
                json.dumps({"structures": [{"begin": "<g>", "end": ""}], "triggers": ["<f"]}),
            ),
            "guided_decoding_guide",
            "starts with none of the triggers",
        ),
        (
            Guide(
                "structural_tag",
                json.dumps(TAG | {"structures": [{"begin": "<fn=", "schema": 3, "end": ""}]}),
            ),
            "guided_decoding_guide",
            "schema object",
        ),
    ],
)
def test_a_bad_guide_is_refused_before_admission_naming_the_field(
    guide: Guide, field: str, reason: str
) -> None:
    llm = spec_engine(tiny_engine(0), None)
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(prompt="go", guide=guide), tokenize_later=True)
    assert info.value.field == field and reason in info.value.message
    assert not llm.has_work()


def test_a_structural_tag_constrains_the_text_after_its_trigger_only() -> None:
    tok = byte_tokenizer()
    compiled = GrammarCompiler(tok.backend, tok.eos_ids, 320).compile(
        Guide("structural_tag", json.dumps(TAG))
    )

    def allowed(text: str) -> int:
        """How many of the text's tokens the grammar takes from its start."""
        return compiled.new_matcher().validate_tokens(tok.encode(text, add_bos=False))

    for text in ('hi <fn=w>{"city":"Oslo"}</fn> and after, <b>any</b> text {x}', "no call at all"):
        assert allowed(text) == len(tok.encode(text, add_bos=False)), text
    # (taken, refused): the text the grammar takes, then one it refuses from the refused part's start
    for taken, refused in (
        ('ok <fn=w>{"', "town"),  # a key the schema does not have
        ("ok <fn=w>{", ' "city"'),  # compact JSON, as its schema asks
        ("ok <fn=", "x>"),  # the begin after its trigger is forced
        ('ok <fn=w>{"city":"Oslo"}</', "x>"),  # then the end
        ('ok <fn=w>{"city":"toolongn', 'ame"'),  # maxLength 8
    ):
        assert allowed(taken + refused) == len(tok.encode(taken, add_bos=False)), (taken, refused)


def test_a_structural_tag_fires_and_its_part_follows_the_schema_whatever_the_drafter() -> None:
    """A trigger the random model emits (a bias toward it): the tagged parts follow the schema, the
    free text around them never holds the trigger, and the text is the same whatever the drafter."""
    lt = byte_tokenizer().encode("<", add_bos=False)[0]
    guide = Guide("structural_tag", json.dumps(TAG | {"triggers": ["<"]}))
    texts = {
        name: _one(guide, drafter=d, max_tokens=80, logit_bias={lt: 3.0})[0]
        for name, d in (("model", "model"), ("none", None))
    }
    assert len(set(texts.values())) == 1, texts
    text = texts["model"]
    tagged = re.findall(r"<fn=w>(.*?)</fn>", text)
    assert len(tagged) >= 2, text
    for part in tagged:
        jsonschema.validate(json.loads(part), CITY_ONLY)
    # free text, whole structures, then (cut at max_tokens) the start of one
    assert re.fullmatch(r'([^<]*<fn=w>\{"city":"[^"]*"\}</fn>)*[^<]*(<fn=w>\{"city":"[^"]*)?', text), text


def test_an_unknown_guide_type_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="guided_decoding_guide_type"):
        Guide("xml", "<a/>")


def test_compiled_grammars_are_cached_by_digest_and_bounded() -> None:
    tok = byte_tokenizer()
    compiler = GrammarCompiler(tok.backend, tok.eos_ids, 320, cache_size=2)
    a = compiler.compile(Guide("regex", "a+"))
    assert compiler.compile(Guide("regex", "a+", field="other")) is a
    compiler.compile(Guide("regex", "b+"))
    compiler.compile(Guide("regex", "c+"))
    assert len(compiler) == 2 and compiler.compiled == 3
    assert compiler.compile(Guide("regex", "a+")) is not a  # evicted, compiled again


def test_forced_tokens_are_drafted_for_free_and_raise_tokens_per_round() -> None:
    """The grammar's forced tokens (keys, braces, quotes) ahead of a drafter that knows no grammar
    (n-gram): more tokens per round, the same text."""
    schema = json.dumps(SCHEMAS[0])
    per_round, texts = {}, {}
    for on in (True, False):
        llm = spec_engine(tiny_engine(0), NgramDrafter(320), grammar_drafts=on)
        guide = Guide("json_schema", schema)
        rid = llm.add_request(GenerationRequest(prompt="go", max_tokens=80, num_draft_tokens=8, guide=guide))
        outs = run_to_completion(llm)[rid]
        texts[on] = "".join(o.new_text for o in outs)
        per_round[on] = len(tokens_of(outs)) / outs[-1].stats.rounds
    assert texts[True] == texts[False]
    assert per_round[True] > per_round[False] + 1.0, per_round


def test_rejection_rule_guided_answers_validate() -> None:
    llm = spec_engine(tiny_engine(0), model_drafter(1), sampling_rule="rejection")
    ids = [
        llm.add_request(_guided(i, s, num_draft_tokens=4, temperature=0.9, seed=i))
        for i, s in enumerate(SCHEMAS)
    ]
    outs = run_to_completion(llm)
    for rid, schema in zip(ids, SCHEMAS):
        jsonschema.validate(json.loads("".join(o.new_text for o in outs[rid])), schema)


def test_a_tokenizer_llguidance_cannot_parse_still_serves_guided_requests() -> None:
    """A decoder llguidance does not read (Fuse): it is given every token's text instead."""
    from tiny import ascii_tokenizer

    llm = spec_engine(tiny_engine(0), model_drafter(1), tokenizer=ascii_tokenizer())
    rid = llm.add_request(
        GenerationRequest(prompt="go", max_tokens=20, guide=Guide("regex", "(ab|cd)[0-9]{2}"))
    )
    assert re.fullmatch("(ab|cd)[0-9]{2}", "".join(o.new_text for o in run_to_completion(llm)[rid]))
