"""What a guided request asks for: plain data, checked before any grammar work."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from trispec.errors import InvalidInputError

# NVIDIA's guide types (tensorrtllm_backend docs/guided_decoding.md; TensorRT-LLM
# GuidedDecodingParams::GuideType): "json" is any JSON object or array, "json_schema" a JSON Schema,
# "regex" a regular expression, "ebnf_grammar" a GBNF/EBNF grammar (llama.cpp's GBNF, which is
# xgrammar's EBNF; a Lark grammar is taken too). "structural_tag": free text in which each structure's
# begin (after one of the triggers) is followed by JSON valid against its schema and its end, as
# TensorRT-LLM's GuideType STRUCTURAL_TAG and vLLM's response_format take it: {"structures": [{"begin",
# "schema", "end"}], "triggers": [...]} (not among the four types NVIDIA's Triton model maps; ours
# takes it). "json_object" is OpenAI's response_format: any object.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag", "json_object")


@dataclass(frozen=True)
class Guide:
    kind: str
    text: str = ""
    # the request field it came from, named in a refusal (guided_decoding_guide, response_format, ...)
    field: str = field(default="guided_decoding_guide", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_TYPES:
            kinds = ", ".join(GUIDE_TYPES[:5])
            message = f"must be one of {kinds}, got {self.kind!r}"
            raise InvalidInputError("guided_decoding_guide_type", message)
        if not isinstance(self.text, str):
            raise InvalidInputError(self.field, f"must be a string, got {type(self.text).__name__}")
        if self.kind not in ("json", "json_object") and not self.text.strip():
            raise InvalidInputError(self.field, f"must not be empty for guide type {self.kind}")

    @property
    def digest(self) -> str:
        """The cache key: the guide type and its text (not the field it came through)."""
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode()).hexdigest()
