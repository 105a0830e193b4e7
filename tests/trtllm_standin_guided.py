"""TensorRT-LLM 1.2.x's guided decoding, as the stand-in executor applies it (tests only).

From TensorRT-LLM's source (TRT = NVIDIA/TensorRT-LLM, release/1.2.1):
* ``GuidedDecodingConfig(backend, encoded_vocab, tokenizer_str, stop_token_ids)`` is given at executor
  creation (executor.h ``class GuidedDecodingConfig``); the C++ runtime takes the XGRAMMAR backend only
  (batch_manager/guidedDecoder.cpp: "LLGuidance is not supported for guided decoding in C++ runtime.");
  without it a request's ``guided_decoding_params`` are not looked at (trtGptModelInflightBatching.cpp:
  "mGuidedDecoder" is null, ``build`` never runs);
* per request ``GuidedDecodingParams(guide_type, guide)``, types JSON, JSON_SCHEMA, REGEX, EBNF_GRAMMAR
  (tensorrtllm_backend tensorrt_llm/1/model.py ``get_guided_decoding_params_from_request``);
* guidedDecoder.cpp ``build``: the matcher is made at the request's first context step, then each
  generation step ``AcceptToken(llmReq->getLastTokens(0))`` -- the LAST token only; ``execute`` masks
  one logits row per request (``invokeLogitsBitmask`` over one pointer per request): with external
  draft tokens only the first of the verify rows is masked and accepted drafts never reach the matcher.
The runtime's grammar engine is xgrammar; here llguidance stands for it (xgrammar's wheel pulls
transformers and an unpinned triton). Nothing of ``trispec`` is imported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import llguidance
import numpy as np
import torch


class GuidedDecodingBackend(enum.Enum):
    XGRAMMAR = 0
    LLGUIDANCE = 1


class GuidedDecodingConfig:
    GuidedDecodingBackend = GuidedDecodingBackend

    def __init__(
        self,
        backend: GuidedDecodingBackend,
        encoded_vocab: list[str] | None = None,
        tokenizer_str: str | None = None,
        stop_token_ids: list[int] | None = None,
    ) -> None:
        if backend is not GuidedDecodingBackend.XGRAMMAR:
            raise RuntimeError(
                "[TensorRT-LLM][ERROR] Assertion failed: LLGuidance is not supported for guided decoding in "
                "C++ runtime."
            )
        self.backend, self.encoded_vocab = backend, encoded_vocab
        self.tokenizer_str, self.stop_token_ids = tokenizer_str, list(stop_token_ids or [])


class GuideType(enum.Enum):
    JSON = 0
    JSON_SCHEMA = 1
    REGEX = 2
    EBNF_GRAMMAR = 3


@dataclass
class GuidedDecodingParams:
    guide_type: GuideType
    guide: str | None = None

    GuideType = GuideType


class Matcher:
    """One request's grammar, as the runtime's decoder drives it."""

    def __init__(self, config: GuidedDecodingConfig, params: GuidedDecodingParams, vocab_size: int) -> None:
        tokenizer = llguidance.LLTokenizer(
            config.tokenizer_str or "", n_vocab=vocab_size, eos_token=config.stop_token_ids or None
        )
        kind, guide = params.guide_type, params.guide or ""
        if kind is GuideType.JSON:  # xgrammar's built-in JSON grammar
            grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": ["object", "array"]})
        elif kind is GuideType.JSON_SCHEMA:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(guide)
        elif kind is GuideType.REGEX:
            grammar = llguidance.LLMatcher.grammar_from_regex(guide)
        else:
            grammar = llguidance.grammar_from("grammar", guide)
        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.vocab_size = vocab_size

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits[: self.vocab_size].astype(bool))
        return row.float().masked_fill(~allowed, float("-inf"))

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)
