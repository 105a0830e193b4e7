"""Run-time tokenizer: a ``tokenizers.Tokenizer`` plus the special ids and chat template it needs.

The files come from ``gguf_tokenizer.py`` (tokenizer.json + tokenizer_info.json, converted
once from a GGUF) or from a Hugging Face weights folder.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers

INFO_FILE = "tokenizer_info.json"

# Tokens that end a turn in the chat formats we serve. The GGUF names one eos id, but an instruct
# model may close its turn with another of these (SmolLM2: eos is <|im_end|>, <|endoftext|> also ends).
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
)


@dataclass(frozen=True)
class TokenizerInfo:
    """Special ids and chat template that tokenizer.json does not carry in a usable form."""

    bos_id: int | None = None
    eos_id: int | None = None
    # every id that ends generation: eos_id plus end-of-turn tokens present in the vocabulary
    eos_ids: frozenset[int] = frozenset()
    pad_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["eos_ids"] = sorted(self.eos_ids)
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TokenizerInfo:
        data = json.loads(text)
        data["eos_ids"] = frozenset(data.get("eos_ids", ()))
        return cls(**data)


def end_of_turn_ids(token_to_id: Mapping[str, int] | Any, eos_id: int | None) -> frozenset[int]:
    """``eos_id`` plus the ids of the end-of-turn tokens that ``token_to_id`` knows."""
    lookup = token_to_id.get if isinstance(token_to_id, Mapping) else token_to_id
    ids = {lookup(tok) for tok in END_OF_TURN_TOKENS}
    ids.add(eos_id)
    return frozenset(i for i in ids if i is not None)


class Tokenizer:
    """Encode prompts, decode outputs, and know which ids end generation."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        info: TokenizerInfo | None = None,
        *,
        eos_ids: Iterable[int] | None = None,
    ) -> None:
        info = info or TokenizerInfo()
        if eos_ids is not None:
            info = dataclasses.replace(info, eos_ids=frozenset(eos_ids))
        self.backend = backend
        self.info = info

    @classmethod
    def from_files(cls, tokenizer_json: str | Path, info_json: str | Path | None = None) -> Tokenizer:
        """Load tokenizer.json; the info comes from ``info_json``, else tokenizer_info.json beside it,
        else a Hugging Face tokenizer_config.json beside it."""
        tokenizer_json = Path(tokenizer_json)
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        info_path = Path(info_json) if info_json is not None else tokenizer_json.with_name(INFO_FILE)
        if info_path.is_file():
            info = TokenizerInfo.from_json(info_path.read_text(encoding="utf-8"))
        else:
            info = _info_from_hf_dir(backend, tokenizer_json.parent)
        return cls(backend, info)

    @functools.cached_property
    def sha256(self) -> str:
        """SHA-256 (hex) of what decides how text becomes ids and a conversation a prompt: the
        tokenizer's serialised form and its info (special ids, chat template). Processes that load the
        same tokenizer agree on it, wherever its files were read from: the OpenAI endpoint sends its
        own with every request, and a server tokenizing for another model refuses it."""
        digest = hashlib.sha256(self.backend.to_str().encode("utf-8"))
        digest.update(b"\0" + self.info.to_json().encode("utf-8"))
        return digest.hexdigest()

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.info.eos_ids

    @property
    def eos_id(self) -> int | None:
        return self.info.eos_id

    @property
    def bos_id(self) -> int | None:
        return self.info.bos_id

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of a prompt (with BOS when the model wants one); ``add_bos=False`` for a piece
        of text inside a sequence (a bad word)."""
        # BOS is added here, not by a post-processor in tokenizer.json, so there is one source of truth
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_bos and self.info.add_bos and self.info.bos_id is not None:
            ids.insert(0, self.info.bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render the model's jinja chat template, as transformers does (sandboxed, trimmed blocks)."""
        if self.info.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        template = env.from_string(self.info.chat_template)
        return template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(self.info.bos_id),
            eos_token=self._token_text(self.info.eos_id),
        )

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")


def _info_from_hf_dir(backend: tokenizers.Tokenizer, folder: Path) -> TokenizerInfo:
    """TokenizerInfo from the tokenizer_config.json of a Hugging Face weights folder (if any)."""
    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))

    def token_id(key: str) -> int | None:
        token = config.get(key)
        if isinstance(token, dict):  # older configs spell tokens as AddedToken dicts
            token = token.get("content")
        return backend.token_to_id(token) if isinstance(token, str) else None

    eos_id = token_id("eos_token")
    return TokenizerInfo(
        bos_id=token_id("bos_token"),
        eos_id=eos_id,
        eos_ids=end_of_turn_ids(backend.token_to_id, eos_id),
        pad_id=token_id("pad_token"),
        add_bos=bool(config.get("add_bos_token", False)),
        chat_template=config.get("chat_template") if isinstance(config.get("chat_template"), str) else None,
    )
