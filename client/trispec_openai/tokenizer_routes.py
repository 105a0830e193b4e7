"""vLLM's tokenizer routes, over the served model's own tokenizer: ``POST /tokenize`` (a prompt, or chat
messages rendered by the model's template), ``POST /detokenize`` and ``GET /tokenizer_info``. Clients
that count or build token-id prompts themselves use them instead of fetching the tokenizer (lm-eval's
``local-completions`` finds them and needs no tokenizer of its own)."""

from __future__ import annotations

from typing import Any

from trispec_openai.errors import invalid
from trispec_openai.schemas import DetokenizeRequest, TokenizeRequest
from trispec_openai.tokens import ServedTokenizer


def tokenize(body: TokenizeRequest, tokenizer: ServedTokenizer) -> dict[str, Any]:
    if body.messages is not None:
        text = tokenizer.chat_template.render([m.for_template() for m in body.messages])
        ids = tokenizer.tokenizer.encode(text, add_bos=bool(body.add_special_tokens))
    else:
        assert body.prompt is not None
        ids = tokenizer.tokenizer.encode(body.prompt, add_bos=body.add_special_tokens is not False)
    answer: dict[str, Any] = {"count": len(ids), "tokens": ids}
    if tokenizer.max_context is not None:  # vLLM's field; left out where the YAML does not say it
        answer["max_model_len"] = tokenizer.max_context
    if body.return_token_strs:
        answer["token_strs"] = [tokenizer.token_string(i) for i in ids]
    return answer


def detokenize(body: DetokenizeRequest, tokenizer: ServedTokenizer) -> dict[str, Any]:
    vocab = tokenizer.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise invalid(f"tokens: {bad} is not a token id of this tokenizer (0 to {vocab - 1})", "tokens")
    return {"prompt": tokenizer.tokenizer.decode(body.tokens, skip_special_tokens=False)}


def tokenizer_info(tokenizer: ServedTokenizer) -> dict[str, Any]:
    """The fields vLLM's /tokenizer_info carries that a client reads: special tokens and chat template."""
    served = tokenizer.tokenizer
    info: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": None if served.eos_id is None else tokenizer.token_text(served.eos_id),
        "bos_token": None if served.bos_id is None else tokenizer.token_text(served.bos_id),
        "chat_template": tokenizer.chat_template.source or None,
        "vocab_size": served.vocab_size,
    }
    if tokenizer.max_context is not None:
        info["model_max_length"] = tokenizer.max_context
    return info
