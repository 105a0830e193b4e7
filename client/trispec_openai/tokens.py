"""The served model's tokenizer, found from the same YAML the server runs (the built-in default when
none is given), for what the frontend needs to know without asking Triton: the chat template, prompt
token counts, and token strings to put beside log-probs.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from trispec.checkpoints import load_tokenizer
from trispec.config import load_config
from trispec.guided.compiler import llg_tokenizer
from trispec.tokenizer import Tokenizer

from trispec_openai.chat import ChatTemplate, NoChatTemplate


class ServedTokenizer:
    def __init__(self, tokenizer: Tokenizer, max_context: int | None = None) -> None:
        self.tokenizer = tokenizer
        # the served context in tokens where the YAML sets it (scheduler.max_context), else unknown here
        self.max_context = max_context
        source = tokenizer.info.chat_template
        self.chat_template: ChatTemplate | NoChatTemplate = (
            NoChatTemplate()
            if source is None
            else ChatTemplate(source, self.token_text(tokenizer.bos_id), self.token_text(tokenizer.eos_id))
        )

    @classmethod
    def from_config(cls, config_path: str | Path | None) -> ServedTokenizer:
        # the server tokenises with the target's tokenizer; a GGUF's is converted once into the cache
        config = load_config(config_path)
        return cls(load_tokenizer(config.target, "target"), config.scheduler.max_context)

    @property
    def sha256(self) -> str:
        """What the model checks this endpoint's requests against (``Tokenizer.sha256``)."""
        return self.tokenizer.sha256

    def count(self, text: str) -> int:
        """Prompt tokens as the server counts them (BOS included where the model adds one)."""
        return len(self.tokenizer.encode(text))

    def split(self, text: str, n: int) -> list[str]:
        """``text`` cut into ``n`` token strings that join back to ``text``.

        The model reports one log-prob per generated token but not the tokens, so the response's text is
        tokenised again. That matches the generated tokens when the model produced the canonical
        tokenisation (nearly always); otherwise the counts differ: a missing tail (an end-of-turn token,
        which has no text) reads as empty strings, an extra tail is joined into the last token.
        """
        if n <= 0:
            return []
        encoding = self.tokenizer.backend.encode(text, add_special_tokens=False)
        pieces: list[str] = []
        end = 0
        for start, stop in encoding.offsets:
            # byte-level BPE gives each token of a split multi-byte character the character's span:
            # the first carries it, the others are empty, so that the pieces still join to the text
            pieces.append(text[max(start, end) : stop] if stop > end else "")
            end = max(end, stop)
        if pieces:
            pieces[-1] += text[end:]
        elif text:
            pieces = [text]
        if len(pieces) > n:
            pieces = [*pieces[: n - 1], "".join(pieces[n - 1 :])]
        return pieces + [""] * (n - len(pieces))

    def token_bytes(self, token_id: int) -> bytes:
        """One token's own bytes (a byte-level token may hold part of a character)."""
        return bytes(self._byte_view.decode_bytes([token_id]))

    def token_string(self, token_id: int) -> str:
        """One token as OpenAI names it: its text, or ``bytes:\\xNN...`` when its bytes are not whole
        UTF-8 characters."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    @cached_property
    def _byte_view(self) -> Any:
        # llguidance reads every tokenizer.json's decoder (byte-level, byte fallback, ...); built once,
        # on the first request that asks for alternatives (about a second for a 150k vocabulary)
        tokenizer = self.tokenizer
        return llg_tokenizer(tokenizer.backend, tokenizer.eos_ids, tokenizer.vocab_size)

    def token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.tokenizer.backend.id_to_token(token_id) or "")
