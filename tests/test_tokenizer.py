"""GGUF -> tokenizer.json conversion and the run-time Tokenizer.

The reference is transformers' own GGUF tokenizer loader. It is used for the vocabulary, merges,
special tokens and decoder; for SmolLM2's pre-tokenizer it differs from the model's real
tokenizer.json (see ``test_smollm_digits_split_like_hf_tokenizer_json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import regex
import tokenizers
from tokenizers import pre_tokenizers
from trispec.checkpoints import smollm2_gguf
from trispec.gguf_tokenizer import (
    QWEN2_SPLIT,
    ensure_tokenizer_json,
    gguf_cache_dir,
    load_tokenizer_for_gguf,
    read_gguf_tokenizer,
    tokenizer_json_from_gguf,
)
from trispec.tokenizer import Tokenizer

CORPUS = [
    "Hello, world!",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's fine, they've said we'll go; you'd agree?",
    "DON'T SHOUT, WE'RE HERE",
    "1",
    "12345678901234567890",
    "pi = 3.14159265, e = 2.71828",
    "version 1.2.3-rc4 (build 20240101)",
    "phone: +1 (555) 010-9999",
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "if __name__ == '__main__':\n\tmain()\n",
    "SELECT * FROM t WHERE id IN (1,2,3);",
    '{"key": [1, 2, {"nested": null}], "ok": true}',
    "<html><body class='x'>Hi</body></html>",
    "x  y   z    w",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "line1\nline2\n\nline4\n\n\n",
    "\r\nwindows\r\nnewlines\r\n",
    " \n \n ",
    "",
    " ",
    "emoji 😀🎉👍🏽 and family 👨\u200d👩\u200d👧",
    "🤖",
    "中文字符测试，你好世界。",
    "日本語のテキストです",
    "한국어 텍스트",
    "Ünïcödé àccénts: café, naïve, Æsir, straße",
    "Ελληνικά και русский текст",
    "العربية من اليمين",
    "मराठी हिंदी",
    "math: ∑ x² ≤ ∞, α→β",
    "mixed中English混合123文字",
    "e\u0301 vs \u00e9 (decomposed vs composed)",
    "zero\u200bwidth\u00a0nbsp",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<file_sep>main.py<repo_name>x",
    "<|im_start",
    "Special-ish < | im_start | > but not",
    "$$\\frac{a}{b}$$ and `code`",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.com",
    "CamelCaseIdentifier snake_case_identifier",
    "!!!???...,,,;;;",
    "a" * 200,
    "🎉" * 20,
]

# Whitespace runs right before a digit: SmolLM2's tokenizer.json splits digits out first, so the
# run stays whole ("ĠĠ"); transformers' GGUF loader uses only the GPT-2 regex and splits it.
DIGIT_AFTER_SPACES = ["a  1", "x = [1,  2]", "  12", "col1\t\t42", "end \n7", "   007"]


def test_corpus_avoids_known_pre_tokenizer_divergence():
    assert len(CORPUS) >= 50
    assert not [s for s in CORPUS if re.search(r"\s\s\d", s)]
    assert all(re.search(r"\s\s\d", s) for s in DIGIT_AFTER_SPACES)


# --- SmolLM2 (real GGUF) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    # same cache folder as test_detokenize, so the session converts the GGUF only once
    return load_tokenizer_for_gguf(smollm2_gguf(), tmp_path_factory.getbasetemp() / "tokcache")


@pytest.fixture(scope="module")
def smollm_files(ours: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_cache_dir(smollm2_gguf(), tmp_path_factory.getbasetemp() / "tokcache") / "tokenizer.json"


@pytest.fixture(scope="module")
def hf_ref():
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.real_model
def test_smollm_encode_matches_transformers(ours: Tokenizer, hf_ref):
    for s in CORPUS:
        assert ours.backend.encode(s).ids == hf_ref.backend_tokenizer.encode(s).ids, s
        assert ours.encode(s) == hf_ref.encode(s), s  # no BOS on either side


@pytest.mark.real_model
def test_smollm_decode_matches_transformers(ours: Tokenizer, hf_ref):
    ref = hf_ref.backend_tokenizer
    cases = [ref.encode(s).ids for s in CORPUS]
    rng = random.Random(0)
    # random ids: specials, and byte tokens that do not form whole UTF-8 characters
    cases += [[rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 30))] for _ in range(200)]
    cases += [[rng.randrange(20) for _ in range(10)] for _ in range(20)]
    for ids in cases:
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), (
                ids
            )


@pytest.mark.real_model
def test_smollm_digits_split_like_hf_tokenizer_json(ours: Tokenizer, hf_ref):
    ref = hf_ref.backend_tokenizer
    assert ours.backend.encode("a  1").tokens == ["a", "ĠĠ", "1"]
    # transformers' loader with SmolLM2's real pre-tokenizer put back agrees everywhere
    fixed = type(ref).from_str(ref.to_str())
    fixed.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    for s in CORPUS + DIGIT_AFTER_SPACES:
        assert ours.backend.encode(s).ids == fixed.encode(s).ids, s
    # ...and the bare loader really does differ there (if it stops differing, revisit the note above)
    assert ours.backend.encode("a  1").ids != ref.encode("a  1").ids


@pytest.mark.real_model
def test_smollm_round_trip(ours: Tokenizer):
    for s in CORPUS + DIGIT_AFTER_SPACES:
        assert ours.decode(ours.encode(s), skip_special_tokens=False) == s
        if "<" not in s:
            assert ours.decode(ours.encode(s)) == s


@pytest.mark.real_model
def test_smollm_special_tokens(ours: Tokenizer):
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert ours.decode(ids) == "user\nhi"
    assert ours.vocab_size == 49152


@pytest.mark.real_model
def test_smollm_info(ours: Tokenizer, smollm_files: Path):
    info = ours.info
    assert (info.bos_id, info.eos_id, info.pad_id, info.add_bos) == (1, 2, 2, False)
    assert ours.token_to_id("<|im_end|>") in info.eos_ids
    assert ours.token_to_id("<|endoftext|>") in info.eos_ids
    assert ours.eos_ids == frozenset({0, 2})
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template
    on_disk = json.loads(smollm_files.with_name("tokenizer_info.json").read_text())
    assert on_disk["eos_ids"] == [0, 2]


@pytest.mark.real_model
def test_smollm_chat_template_matches_transformers(ours: Tokenizer, hf_ref):
    for messages in (
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"}],
    ):
        expected = hf_ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages) == expected


# --- synthetic GGUFs ----------------------------------------------------------------------------

TINY_MERGES = ["Ġ Ġ", "1 2", "h e", "l l", "he ll", "hell o", "Ġ hello", "Ċ Ċ", "ĠĠ Ġ", "Ġ 1"]
TINY_SPECIALS = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)]
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_gguf(path: Path, pre: str = "qwen2", model: str = "gpt2", add_bos: bool = False) -> Path:
    """A tokenizer-only GGUF shaped like Qwen2.5's: byte alphabet, a few merges, chat specials."""
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m.split(" ")) for m in TINY_MERGES]
    types = [1] * len(tokens) + [kind for _, kind in TINY_SPECIALS]
    tokens += [t for t, _ in TINY_SPECIALS]
    ids = {t: i for i, t in enumerate(tokens)}
    w = gguf.GGUFWriter(str(path), "qwen2")
    # the few hyperparameters transformers wants before it will build the tokenizer
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(TINY_MERGES)
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_eos_token_id(ids["<|im_end|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(TINY_TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


QWEN_CASES = [
    "12345",
    "hello 12345 x",
    "a   hello",
    "x\n\n  y",
    "line\r\n\r\nnext",
    "  \n\t hello",
    "it's DON'T we'LL",
    "(hello) [hello]!!\n\n",
    " 1 12 a12 1.5",
    "中文 😀 café",
    "end   ",
    "<tool_call>hello<|im_end|>",
]


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("qwen") / "tiny-qwen.gguf")


def test_qwen2_pre_tokenizer_follows_qwen2_regex(qwen_gguf: Path):
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert QWEN2_SPLIT == PRETOKENIZE_REGEX
    tok = tokenizer_json_from_gguf(qwen_gguf)
    to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for s in QWEN_CASES[:-1]:
        pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(s)]
        expected = [
            p for piece in regex.findall(PRETOKENIZE_REGEX, s) for p, _ in to_bytes.pre_tokenize_str(piece)
        ]
        assert pieces == expected, s


def test_qwen2_digits_and_whitespace(qwen_gguf: Path):
    tok = tokenizer_json_from_gguf(qwen_gguf)
    # the "1 2" merge exists, but Qwen2 splits every digit apart before BPE
    assert tok.encode("12345").tokens == ["1", "2", "3", "4", "5"]
    assert tok.encode("a   hello").tokens == ["a", "ĠĠ", "Ġhello"]
    assert tok.encode("x\n\n  y").tokens == ["x", "ĊĊ", "Ġ", "Ġ", "y"]
    assert tok.encode("<tool_call>hello<|im_end|>").tokens == ["<tool_call>", "hello", "<|im_end|>"]


def test_gpt2_pre_uses_plain_byte_level_regex(tmp_path: Path):
    tok = tokenizer_json_from_gguf(write_tiny_gguf(tmp_path / "g.gguf", pre="gpt2"))
    assert tok.encode("12345").tokens == ["12", "3", "4", "5"]
    assert tok.encode(" 12").tokens == ["Ġ", "12"]


def test_qwen2_matches_transformers(qwen_gguf: Path):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_gguf.parent), gguf_file=qwen_gguf.name)
    ours = tokenizer_json_from_gguf(qwen_gguf)
    assert ours.get_vocab_size(True) == ref.backend_tokenizer.get_vocab_size(True)
    for s in QWEN_CASES:
        ids = ours.encode(s).ids
        assert ids == ref.backend_tokenizer.encode(s).ids, s
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_qwen2_info_and_wrapper(qwen_gguf: Path, tmp_path: Path):
    tok = load_tokenizer_for_gguf(qwen_gguf, tmp_path)
    im_end, endoftext = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert (tok.eos_id, tok.bos_id, tok.info.pad_id) == (im_end, endoftext, endoftext)
    assert tok.eos_ids == frozenset({im_end, endoftext})
    assert tok.encode("hello")[0] != endoftext  # add_bos is false
    # user-defined tokens are text, control tokens are not
    assert tok.decode(tok.encode("<tool_call>hi<|im_end|>")) == "<tool_call>hi"
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == tok.token_to_id("<|im_start|>")


def test_add_bos_from_gguf(tmp_path: Path):
    tok = load_tokenizer_for_gguf(write_tiny_gguf(tmp_path / "b.gguf", add_bos=True), tmp_path / "cache")
    assert tok.encode("hello") == [tok.bos_id, tok.backend.token_to_id("hello")]


def test_unknown_pre_names_the_key(tmp_path: Path):
    path = write_tiny_gguf(tmp_path / "u.gguf", pre="llama-bpe-unknown")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre 'llama-bpe-unknown'"):
        tokenizer_json_from_gguf(path)


def test_non_bpe_model_rejected(tmp_path: Path):
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model"):
        read_gguf_tokenizer(write_tiny_gguf(tmp_path / "l.gguf", model="llama"))


def test_ensure_converts_once_and_again_when_gguf_is_newer(qwen_gguf: Path, tmp_path: Path):
    out = tmp_path / "sub" / "tokenizer.json"
    assert ensure_tokenizer_json(qwen_gguf, out) == out
    info = out.with_name("tokenizer_info.json")
    old = 1_000_000_000
    source = qwen_gguf.stat().st_mtime
    for p in (out, info):
        os.utime(p, (source + 10, source + 10))
    ensure_tokenizer_json(qwen_gguf, out)
    assert out.stat().st_mtime == source + 10  # fresh: reused, not rewritten
    os.utime(out, (old, old))  # stale (older than the GGUF): converted again
    ensure_tokenizer_json(qwen_gguf, out)
    assert out.stat().st_mtime > old
    assert (
        Tokenizer.from_files(out).encode("hello 12")
        == tokenizer_json_from_gguf(qwen_gguf).encode("hello 12").ids
    )


def test_runtime_module_does_not_import_build_code():
    code = "import sys, trispec.tokenizer, trispec.detokenize; assert 'trispec_build' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_from_files_hf_folder(tmp_path: Path, qwen_gguf: Path):
    tokenizer_json_from_gguf(qwen_gguf).save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None, "pad_token": {"content": "<|endoftext|>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TINY_TEMPLATE}))
    tok = Tokenizer.from_files(tmp_path / "tokenizer.json")
    assert tok.eos_id == tok.token_to_id("<|im_end|>")
    assert tok.info.pad_id == tok.token_to_id("<|endoftext|>")
    assert tok.bos_id is None and tok.eos_ids == frozenset({tok.eos_id, tok.info.pad_id})


def test_sha256_names_the_tokenizer_wherever_it_was_read_from(qwen_gguf: Path, tmp_path: Path):
    """Two loads from two cache folders agree (the OpenAI endpoint and the server compute it apart);
    another chat template or another vocabulary gives another digest."""
    tok = load_tokenizer_for_gguf(qwen_gguf, tmp_path / "a")
    again = load_tokenizer_for_gguf(qwen_gguf, tmp_path / "b")
    assert tok.sha256 == again.sha256 and len(tok.sha256) == 64
    template = Tokenizer(tok.backend, dataclasses.replace(tok.info, chat_template="{{ messages }}"))
    assert template.sha256 != tok.sha256
    backend = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    backend.add_special_tokens(["<|extra|>"])
    assert Tokenizer(backend, tok.info).sha256 != tok.sha256
