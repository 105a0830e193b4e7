"""The model fingerprint (``trispec.serving.fingerprint``): what changes a replica's text changes it,
what only changes capacity or names does not, and weight files are hashed once per file version.

No model is loaded: the configs point at small files standing in for weights and a tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trispec.config import SpecDecConfig, parse_config
from trispec.drafters.draft_vocab import corpus_digest, stdlib_corpus
from trispec.engine.cpu.linear import DenseLinear, GGUFLinear, Int8Linear
from trispec.serving import file_digests
from trispec.serving.fingerprint import (
    DRAFT_KEYS,
    NOT_OUTPUT_KEYS,
    model_fingerprint,
    numerics_path,
    output_config,
    uses_onednn,
)


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "weights.safetensors").write_bytes(b"w" * 4096)
    (tmp_path / "tokenizer.json").write_text('{"model": "bpe"}')
    return tmp_path


def config(files: Path, **sections: Any) -> SpecDecConfig:
    data: dict[str, Any] = {
        "target": {
            "checkpoint": {"path": str(files / "weights.safetensors")},
            "tokenizer": str(files / "tokenizer.json"),
        },
        "drafter": {"kind": "self", "precision": "int8"},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return parse_config(data)


def fingerprint(files: Path, **sections: Any) -> str:
    return model_fingerprint(config(files, **sections)).value


def test_the_same_model_has_the_same_fingerprint(files: Path) -> None:
    first = model_fingerprint(config(files))
    assert first == model_fingerprint(config(files))
    assert len(first.value) == 16 and int(first.value, 16) >= 0
    assert set(first.parts) == {"config", "weights", "tokenizer", "numerics", "code"}


REJECTION = {"speculation": {"sampling_rule": "rejection"}}


@pytest.mark.parametrize(
    "change",
    [
        {"defaults": {"temperature": 0.7}},
        {"defaults": {"max_tokens": 32}},
        {"target": {"dtype": "bfloat16"}},
        REJECTION,  # the rule itself
    ],
)
def test_a_setting_that_changes_outputs_changes_it(files: Path, change: dict[str, Any]) -> None:
    assert fingerprint(files, **change) != fingerprint(files)


def draft_model(files: Path, name: str = "draft.safetensors", content: bytes = b"d" * 1024) -> dict[str, Any]:
    (files / name).write_bytes(content)
    model = {"checkpoint": {"path": str(files / name)}, "tokenizer": str(files / "tokenizer.json")}
    return {"kind": "model", "precision": None, "model": model}


DRAFT_CHANGES = {
    "precision": lambda files: {"drafter": {"precision": "bfloat16"}},
    "ngram": lambda files: {"drafter": {"kind": "ngram", "precision": None}},
    "suffix beside": lambda files: {"drafter": {"with_suffix": True}},
    "draft model": lambda files: {"drafter": draft_model(files)},
    "max k": lambda files: {"scheduler": {"max_num_draft_tokens": 4}},
    "default k": lambda files: {"scheduler": {"default_num_draft_tokens": 2}},
    "draft vocabulary": lambda files: {"drafter": {"draft_vocab": 4096}},
}


@pytest.mark.parametrize("change", list(DRAFT_CHANGES))
def test_the_drafter_and_k_count_only_under_the_rejection_rule(files: Path, change: str) -> None:
    """Under the coupled rule (the default) a seed's text is plain sampling's whatever is drafted, so
    what drafts and how many leave the fingerprint alone; under the p/q test a seed's text depends on
    the drafts, and each of them changes it."""
    changed = DRAFT_CHANGES[change](files)
    assert fingerprint(files, **changed) == fingerprint(files)
    assert fingerprint(files, **changed, **REJECTION) != fingerprint(files, **REJECTION)


def test_a_draft_model_s_weights_count_only_under_the_rejection_rule(files: Path) -> None:
    one = draft_model(files, "one.safetensors", b"1" * 1024)
    two = draft_model(files, "two.safetensors", b"2" * 1024)
    assert fingerprint(files, drafter=one) == fingerprint(files, drafter=two)
    assert fingerprint(files, drafter=one, **REJECTION) != fingerprint(files, drafter=two, **REJECTION)
    parts = model_fingerprint(config(files, drafter=one)).parts
    assert parts == model_fingerprint(config(files, drafter={"kind": "none", "precision": None})).parts


def test_the_draft_vocabulary_s_corpus_counts_under_the_rejection_rule(files: Path) -> None:
    """Which ids a ``draft_vocab`` head computes is ranked by this Python's standard library: under
    the rejection rule that corpus is part of the model."""
    vocab = {"drafter": {"draft_vocab": 4096}}
    assert "draft_vocab_corpus" not in model_fingerprint(config(files, **vocab)).parts
    parts = model_fingerprint(config(files, **vocab, **REJECTION)).parts
    assert parts["draft_vocab_corpus"] == corpus_digest(stdlib_corpus())


@pytest.mark.parametrize(
    "change",
    [
        {"serving": {"model_name": "tensorrt_llm_bls", "max_prompt_bytes": 1000}},
        {"scheduler": {"max_batch_size": 4, "max_waiting": 2, "max_queue_delay_s": 9.0}},
        {"scheduler": {"max_prefill_tokens_per_step": 64, "adaptive_speculation": False}},
        {"target": {"kv_cache_mb": 64}, "drafter": {"kv_cache_mb": 32}},
        {"num_threads": 1},
    ],
)
def test_capacity_limits_and_names_do_not(files: Path, change: dict[str, Any]) -> None:
    assert fingerprint(files, **change) == fingerprint(files)


def _leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        out |= _leaves(value, dotted + ".") if isinstance(value, dict) and value else {dotted}
    return out


@pytest.mark.parametrize("rule", ["coupled", "rejection"])
def test_every_other_key_counts_including_sections_added_later(files: Path, rule: str) -> None:
    """Only a fixed list of keys is left out (and file locations, whose digests count instead; and,
    under the coupled rule, what drafts and how many), so a key added later, such as a
    ``speculation`` section, counts without anyone listing it."""
    cfg = config(
        files,
        drafter={"kind": "model", "model": {"checkpoint": {"path": str(files / "w.gguf")}}},
        speculation={"sampling_rule": rule},
    )
    dumped = cfg.model_dump(mode="json")
    removed = _leaves(dumped) - _leaves(output_config(cfg))
    left_out = NOT_OUTPUT_KEYS | DRAFT_KEYS if rule == "coupled" else NOT_OUTPUT_KEYS
    assert ("drafter.kind" in removed) == (rule == "coupled")
    for dotted in removed:
        listed = any(dotted == k or dotted.startswith(k + ".") for k in left_out)
        located = any(
            f".{k}" in f".{dotted}"
            for k in ("target.checkpoint", "target.tokenizer", "model.checkpoint", "model.tokenizer")
        )
        assert listed or located, dotted
    later = {**dumped, "speculation": {"sampling_rule": "coupled"}}
    kept = output_config(SimpleNamespace(model_dump=lambda mode: later))  # type: ignore[arg-type]
    assert kept["speculation"] == {"sampling_rule": "coupled"}


def test_weights_and_tokenizer_count_by_content_not_by_path(files: Path) -> None:
    before = fingerprint(files)
    moved = files / "elsewhere"
    moved.mkdir()
    for name in ("weights.safetensors", "tokenizer.json"):
        (moved / name).write_bytes((files / name).read_bytes())
    assert fingerprint(moved) == before
    (files / "weights.safetensors").write_bytes(b"w" * 4095 + b"x")
    assert fingerprint(files) != before
    (files / "weights.safetensors").write_bytes(b"w" * 4096)
    assert fingerprint(files) == before
    (files / "tokenizer.json").write_text('{"model": "unigram"}')
    assert fingerprint(files) != before


def test_a_file_is_hashed_once_per_version(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = files / "weights.safetensors"
    assert file_digests.sha256_of(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    reads = []
    real_open = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path.resolve() and args[:1] == ("rb",):
            reads.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_open)
    file_digests.sha256_of(path)
    assert reads == []  # from the cache
    # same size, rewritten: the mtime (or inode) moves, so it is hashed again
    stat = path.stat()
    path.write_bytes(b"v" * 4096)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert file_digests.sha256_of(path) == hashlib.sha256(b"v" * 4096).hexdigest()
    assert len(reads) == 1


def test_the_numerics_path_names_the_isa_only_where_onednn_computes(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(files)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    capability = torch.backends.cpu.get_cpu_capability().lower()
    assert numerics_path(cfg, isa_dependent=True).startswith(f"cpu {capability}")
    if capability in ("avx2", "avx512"):
        assert numerics_path(cfg, isa_dependent=False) == "cpu avx2-or-avx512"
    uncapped = {dependent: numerics_path(cfg, isa_dependent=dependent) for dependent in (True, False)}
    uncapped_fingerprint = model_fingerprint(cfg, isa_dependent=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    # a oneDNN cap changes a model that oneDNN computes, and nothing of one that only our kernels compute
    assert numerics_path(cfg).endswith("onednn<=avx2") and numerics_path(cfg) != uncapped[True]
    assert numerics_path(cfg, isa_dependent=False) == uncapped[False]
    assert model_fingerprint(cfg, isa_dependent=False) == uncapped_fingerprint
    assert model_fingerprint(cfg, isa_dependent=False) != model_fingerprint(cfg, isa_dependent=True)
    cuda = config(files, target={"device": "cuda"})
    assert numerics_path(cuda).startswith("cuda ")
    trt = parse_config(
        {"engine": {"kind": "trtllm"}, "target": {"checkpoint": {"path": "/x"}}, "drafter": {"kind": "none"}}
    )
    assert numerics_path(trt) == "tensorrt-llm"


def test_uses_onednn_looks_at_every_linear_layer_of_target_and_draft() -> None:
    weight = torch.randn(16, 16)
    dense, int8 = DenseLinear(weight), Int8Linear.from_float(weight, None, dtype=torch.float32)
    gguf = object.__new__(GGUFLinear)

    def engine(*layers: object) -> SimpleNamespace:
        return SimpleNamespace(model=SimpleNamespace(linears=lambda: list(layers)))

    assert uses_onednn(SimpleNamespace(target=engine(dense), drafter=None))
    assert not uses_onednn(SimpleNamespace(target=engine(gguf, gguf), drafter=None))
    # a draft model beside suffix decoding, on oneDNN: sampled draws depend on it
    suffix_draft = SimpleNamespace(model=SimpleNamespace(engine=engine(dense)))
    assert uses_onednn(SimpleNamespace(target=engine(gguf), drafter=suffix_draft))
    assert not uses_onednn(SimpleNamespace(target=engine(gguf), drafter=SimpleNamespace(engine=engine(int8))))
    assert uses_onednn(SimpleNamespace(something="else"))  # unknown: counts as ISA-dependent
