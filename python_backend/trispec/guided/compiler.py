"""Guides compiled into llguidance grammars, checked against our tokenizer, cached by digest.

``compile`` runs on the caller's thread (a server's request thread, before admission): a bad schema,
regex or grammar is refused there with llguidance's reason, and the step loop only copies a ready
matcher. The cache is bounded (least recently used out first); two threads compiling the same new
guide at once both compile it, and one result is kept.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import llguidance
import tokenizers

from trispec.errors import InvalidInputError
from trispec.guided.spec import Guide
from trispec.guided.xgrammar_json import JSON_OPTIONS, xgrammar_schema

DEFAULT_CACHE_SIZE = 256
# added to a tokenizer that has no end-of-sequence token: llguidance needs one to say "complete"
GUIDE_END_TOKEN = "<|guided_end|>"


@dataclass(frozen=True)
class CompiledGrammar:
    digest: str
    kind: str
    # what was asked (a runtime with its own grammar engine, TensorRT-LLM's, is sent this)
    guide: Guide = field(compare=False, repr=False)
    # a fresh matcher at the grammar's start; each sequence takes a deep copy
    template: llguidance.LLMatcher = field(compare=False, repr=False)
    tokenizer: llguidance.LLTokenizer = field(compare=False, repr=False)

    def new_matcher(self) -> llguidance.LLMatcher:
        return self.template.deep_copy()


def llg_tokenizer(backend: tokenizers.Tokenizer, eos_ids: frozenset[int], vocab_size: int) -> Any:
    """llguidance's view of our tokenizer (tokenizer.json, or the one converted from a GGUF), over the
    model's vocabulary (ids past the tokenizer's are never allowed)."""
    eos = sorted(i for i in eos_ids if i < vocab_size)
    tokenizer = backend
    if not eos:  # e.g. a test tokenizer: an end token of its own, which no text can produce
        tokenizer = tokenizers.Tokenizer.from_str(backend.to_str())
        tokenizer.add_special_tokens([GUIDE_END_TOKEN])
        eos = [tokenizer.token_to_id(GUIDE_END_TOKEN)]
    n_vocab = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    try:
        return llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=n_vocab, eos_token=eos)
    except ValueError:  # a decoder llguidance does not read (e.g. Fuse): each token's own text then
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTexts(tokenizer, n_vocab, eos)))


class _TokenTexts:
    """A tokenizer as llguidance's generic interface sees it: every id's bytes (its decoded text; ids
    past the tokenizer's are empty, never allowed) and encoding."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, n_vocab: int, eos: list[int]) -> None:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.tokens = [
            tokenizer.decode([i], skip_special_tokens=False).encode() if i < size else b""
            for i in range(n_vocab)
        ]
        self.eos_token_id = eos[0]
        self.bos_token_id = None
        self.special_token_ids = list(eos)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids


def structural_tag_grammar(text: str, field: str, special: frozenset[str] = frozenset()) -> str:
    """A structural tag (``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``) as a Lark
    grammar (llguidance's ``StructTag``): any text, in which a trigger starts its structure's begin,
    then JSON valid against its schema, then its end. A ``<...>`` trigger that is one of the tokenizer's
    ``special`` tokens is matched as that token (as a model emits it), any other as text."""
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise InvalidInputError(
            field, "the structural tag must be a JSON object with structures and triggers"
        )
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise InvalidInputError(
            field, "structural tag: triggers must be a non-empty list of non-empty strings"
        )
    if not isinstance(structures, list) or not structures:
        raise InvalidInputError(field, "structural tag: structures must be a non-empty list")
    tags = []
    for i, structure in enumerate(structures):
        if not isinstance(structure, dict):
            structure = {}
        begin, end = structure.get("begin"), structure.get("end")
        schema = structure.get("schema", {"type": "object"})
        if not isinstance(begin, str) or not isinstance(end, str) or not isinstance(schema, dict):
            raise InvalidInputError(
                field,
                f"structural tag: structures[{i}] must have a begin and an end string and a schema object",
            )
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise InvalidInputError(
                field, f"structural tag: structures[{i}].begin {begin!r} starts with none of the triggers"
            )
        # JSON as for json_schema guides: as xgrammar takes it (a schema's own x-guidance options win)
        schema = xgrammar_schema(schema)
        tags.append(llguidance.StructTag(trigger=trigger, begin=begin, grammar=schema, end=end))
    bracketed = [t for t in triggers if t.startswith("<") and t.endswith(">")]
    return llguidance.StructTag.to_grammar(tags, assume_special=bool(bracketed) and set(bracketed) <= special)


def special_tokens(backend: tokenizers.Tokenizer) -> frozenset[str]:
    """The tokenizer's special tokens' texts (a structural tag's ``<...>`` triggers among them)."""
    return frozenset(t.content for t in backend.get_added_tokens_decoder().values() if t.special)


def grammar_text(guide: Guide, special: frozenset[str] = frozenset()) -> str:
    """The guide as an llguidance grammar; raises ``InvalidInputError`` naming the guide's field.
    ``special``: the tokenizer's special tokens (``special_tokens``), for structural tags."""
    try:
        # JSON as TensorRT-LLM's xgrammar takes it: whitespace between tokens, a schema's objects
        # closed unless it says otherwise (guided/xgrammar_json.py)
        if guide.kind == "json":  # TensorRT-LLM's "json": xgrammar's built-in JSON (object or array)
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": ["object", "array"]}, defaults=JSON_OPTIONS
            )
        if guide.kind == "json_object":  # OpenAI's: any object
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if guide.kind == "json_schema":
            schema = json.loads(guide.text)
            if not isinstance(schema, dict):
                raise InvalidInputError(guide.field, "the JSON schema must be a JSON object")
            return llguidance.LLMatcher.grammar_from_json_schema(xgrammar_schema(schema))
        if guide.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guide.text)
        if guide.kind == "structural_tag":
            return structural_tag_grammar(guide.text, guide.field, special)
        return llguidance.grammar_from("grammar", guide.text)  # ebnf_grammar: GBNF or Lark
    except json.JSONDecodeError as exc:
        what = "structural tag" if guide.kind == "structural_tag" else "JSON schema"
        raise InvalidInputError(guide.field, f"the {what} is not valid JSON: {exc}") from exc
    except (ValueError, TypeError, RuntimeError, AssertionError) as exc:
        if isinstance(exc, InvalidInputError):
            raise
        raise InvalidInputError(guide.field, f"invalid {guide.kind}: {exc}") from exc


class GrammarCompiler:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        eos_ids: frozenset[int],
        vocab_size: int,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self._backend, self._eos_ids = backend, eos_ids
        self._special = special_tokens(backend)
        self._tokenizer: Any = None  # llguidance's view of it, made on the first guided request
        self._unusable: str | None = None
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # compilations done (cache misses), for tests and metrics

    @property
    def tokenizer(self) -> Any:
        """llguidance's tokenizer (~0.4 s for a 49k vocabulary, once); raises ``InvalidInputError`` where
        llguidance cannot read ours: then guided requests are refused, nothing else changes."""
        with self._lock:
            if self._tokenizer is None and self._unusable is None:
                try:
                    self._tokenizer = llg_tokenizer(self._backend, self._eos_ids, self.vocab_size)
                except (ValueError, RuntimeError) as exc:
                    self._unusable = str(exc)
            if self._unusable is not None:
                raise InvalidInputError(
                    "guided_decoding_guide",
                    f"guided decoding is not available with this model's tokenizer ({self._unusable})",
                )
            return self._tokenizer

    def compile(self, guide: Guide) -> CompiledGrammar:
        tokenizer = self.tokenizer
        digest = guide.digest
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                return hit
        grammar = grammar_text(guide, self._special)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise InvalidInputError(guide.field, f"invalid {guide.kind}: {error.strip()}")
        template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if template.is_error():
            raise InvalidInputError(guide.field, f"invalid {guide.kind}: {template.get_error().strip()}")
        compiled = CompiledGrammar(digest, guide.kind, guide, template, tokenizer)
        with self._lock:
            self.compiled += 1
            self._cache[digest] = compiled
            self._cache.move_to_end(digest)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._cache)
