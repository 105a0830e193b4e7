"""Turn the tokenizer a GGUF describes into tokenizer.json (+ tokenizer_info.json), once, and load it.

A GGUF stores a byte-level BPE as metadata under llama.cpp's keys: tokens (already spelled in the
GPT-2 byte alphabet), merges, token types, special ids and a ``tokenizer.ggml.pre`` name for the
pre-tokenizer. We rebuild the same ``tokenizers`` pipeline Hugging Face ships for that model, so ids
match what the model was trained on (checked against transformers' own GGUF loader in the tests).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from trispec.gguf_file import open_gguf
from trispec.tokenizer import INFO_FILE, TokenizerInfo, end_of_turn_ids
from trispec.tokenizer import Tokenizer as RuntimeTokenizer

# llama.cpp token types (gguf.TokenType)
_CONTROL = 3
_USER_DEFINED = 4

# Qwen2's split, as in its tokenizer.json: digits one by one, letters with one leading non-letter,
# punctuation runs with trailing newlines, newline runs, then other whitespace.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _smollm() -> pre_tokenizers.PreTokenizer:
    # as SmolLM2's tokenizer.json: every digit on its own, then the GPT-2 regex split
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _qwen2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# tokenizer.ggml.pre -> pre-tokenizer; names as llama.cpp's converter writes them
PRE_TOKENIZERS = {
    "smollm": _smollm,
    "qwen2": _qwen2,
    "deepseek-r1-qwen": _qwen2,
    "gpt2": _gpt2,
    "gpt-2": _gpt2,
    "default": _gpt2,
}


@dataclass(frozen=True)
class GGUFTokenizerData:
    """The tokenizer.* metadata of one GGUF, decoded."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    meta: dict[str, Any]  # the scalar tokenizer.* keys (ids, flags, chat template)


def _field_value(field: Any) -> Any:
    """A GGUF metadata value as Python (strings, ints, bools, or lists of them)."""
    types = field.types
    if types[0] == gguf.GGUFValueType.ARRAY:
        if types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8")
    return field.parts[-1].tolist()[0]


def read_gguf_tokenizer(gguf_path: str | Path) -> GGUFTokenizerData:
    reader = open_gguf(gguf_path)
    values = {key: _field_value(f) for key, f in reader.fields.items() if key.startswith("tokenizer.")}
    model = values.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"{gguf_path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is supported"
        )
    if "tokenizer.ggml.merges" not in values:
        raise ValueError(f"{gguf_path}: tokenizer.ggml.merges is missing; a byte-level BPE needs its merges")
    tokens = values["tokenizer.ggml.tokens"]
    return GGUFTokenizerData(
        model=model,
        pre=values.get("tokenizer.ggml.pre", "default"),  # llama.cpp's default when the key is absent
        tokens=tokens,
        token_types=values.get("tokenizer.ggml.token_type", [1] * len(tokens)),
        merges=values["tokenizer.ggml.merges"],
        meta={k: v for k, v in values.items() if not isinstance(v, list)},
    )


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the spelling byte-level vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    mapping = {b: chr(b) for b in [*printable, *range(ord("®"), ord("ÿ") + 1)]}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_tokenizer(data: GGUFTokenizerData) -> Tokenizer:
    pre = PRE_TOKENIZERS.get(data.pre)
    if pre is None:
        raise ValueError(
            f"tokenizer.ggml.pre {data.pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}. "
            "Add its split regex to trispec.gguf_tokenizer.PRE_TOKENIZERS."
        )
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    # llama.cpp stores added tokens as raw text; respell any that leave the byte alphabet so their
    # vocabulary entry is reachable, as transformers' GGUF loader does
    vocab: dict[str, int] = {}
    for index, token in enumerate(data.tokens):
        spelled = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(spelled, index)
    merges = [tuple(m.split(" ", 1)) for m in data.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre()
    tok.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>) must match whole and be skippable on decode; a "control" token
    # outside the byte alphabet is a converter mislabel, and adding it would grow the vocabulary
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(data.tokens, data.token_types, strict=True)
            if kind == _CONTROL and set(t) <= alphabet
        ]
    )
    # user-defined tokens (<tool_call>) also match whole in llama.cpp, but are ordinary text
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(data.tokens, data.token_types, strict=True)
            if kind == _USER_DEFINED and t in vocab
        ]
    )
    return tok


def build_info(data: GGUFTokenizerData, tok: Tokenizer) -> TokenizerInfo:
    meta = data.meta
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = end_of_turn_ids(tok.token_to_id, eos_id)
    # llama.cpp also names the end-of-turn / end-of-message tokens for some models
    extra = [meta.get(k) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")]
    eos_ids = eos_ids | {i for i in extra if i is not None}
    if eos_id is None and not eos_ids:
        raise ValueError("tokenizer.ggml.eos_token_id is missing and no end-of-turn token is in the vocab")
    return TokenizerInfo(
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_id=eos_id if eos_id is not None else min(eos_ids),
        eos_ids=frozenset(eos_ids),
        # a batch needs some pad id; eos is what llama.cpp-converted models fall back to as well
        pad_id=meta.get("tokenizer.ggml.padding_token_id", eos_id),
        # byte-level BPE models add no BOS unless the file says so (transformers' default too)
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def tokenizer_json_from_gguf(gguf_path: str | Path) -> Tokenizer:
    return build_tokenizer(read_gguf_tokenizer(gguf_path))


def tokenizer_info_from_gguf(gguf_path: str | Path) -> TokenizerInfo:
    data = read_gguf_tokenizer(gguf_path)
    return build_info(data, build_tokenizer(data))


def _write_atomic(path: Path, text: str) -> None:
    # several workers may convert at once; a reader must never see a half-written file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_tokenizer_json(gguf_path: str | Path, out_path: str | Path) -> Path:
    """Write tokenizer.json at ``out_path`` (and tokenizer_info.json beside it) unless both are
    already there and newer than the GGUF. Returns ``out_path``."""
    gguf_path, out_path = Path(gguf_path), Path(out_path)
    info_path = out_path.with_name(INFO_FILE)
    source_mtime = gguf_path.stat().st_mtime
    if all(p.is_file() and p.stat().st_mtime >= source_mtime for p in (out_path, info_path)):
        return out_path
    data = read_gguf_tokenizer(gguf_path)
    tok = build_tokenizer(data)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # info first: a reader that finds a fresh tokenizer.json may rely on its sibling being there
    _write_atomic(info_path, build_info(data, tok).to_json())
    _write_atomic(out_path, tok.to_str())
    return out_path


def gguf_cache_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """One folder per GGUF: its stem for humans, a hash of its full path so two same-named files differ."""
    digest = hashlib.sha1(str(gguf_path.resolve()).encode()).hexdigest()[:10]
    return cache_dir / "tokenizers" / f"{gguf_path.stem}-{digest}"


def load_tokenizer_for_gguf(gguf_path: str | Path, cache_dir: str | Path) -> RuntimeTokenizer:
    """Tokenizer for a GGUF, converting its metadata to tokenizer.json once under ``cache_dir``."""
    gguf_path = Path(gguf_path)
    folder = gguf_cache_dir(gguf_path, Path(cache_dir))
    tokenizer_json = ensure_tokenizer_json(gguf_path, folder / "tokenizer.json")
    return RuntimeTokenizer.from_files(tokenizer_json, tokenizer_json.with_name(INFO_FILE))
