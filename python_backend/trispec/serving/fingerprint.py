"""The model fingerprint: one digest of everything that decides a replica's text for a request.

A stream cut on one replica may be resumed on another only if both would give the same tokens for
the same request (``skip_output_tokens`` then skips exactly what was delivered). On the CPU engine
a greedy or seeded request's tokens are fixed by:

- ``config``: the YAML's settings that can change a token (the model sections, the speculation and
  scheduler settings that reach sampling, the generation defaults, any section added later), with
  file locations replaced by the files' digests; only keys known to change nothing but capacity,
  limits or names are left out (``NOT_OUTPUT_KEYS``);
- ``weights``: the SHA-256 of the target's checkpoint files (cached per file version:
  ``file_digests``);
- ``tokenizer``: the SHA-256 of the tokenizer files the model reads;
- ``numerics``: ``cpu`` with, where a layer runs on oneDNN, the ISA level (AVX-512 and AVX2 replicas
  of the default model give different logit bits: docs/determinism.md), native bf16, AMX and a
  oneDNN ISA cap; whether the C kernels are there; ``cuda`` with the GPU; ``tensorrt-llm``;
- ``code``: the SHA-256 of the ``trispec`` package's sources (a new version may sample differently).

What drafts (the ``drafter`` section, a draft model's weights, tokenizer and numerics) and how many
(``scheduler.max_num_draft_tokens``, ``default_num_draft_tokens``) count only where they can change
the text: under ``speculation.sampling_rule: rejection`` (and TensorRT-LLM, whose executor uses that
rule), where a seeded request's tokens depend on its drafts. Under the default ``coupled`` rule the
text is plain sampling's whatever was drafted (docs/determinism.md), so replicas that differ only in
drafter or k serve the same model and resume each other's streams (``DRAFT_KEYS``).

The fingerprint is the first 16 hex digits of the SHA-256 of those parts. It is computed once, when
the model loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trispec.checkpoints import resolve_checkpoint
from trispec.config import ModelConfig, SpecDecConfig
from trispec.drafters.draft_vocab import corpus_digest, stdlib_corpus
from trispec.serving.file_digests import sha256_of, sha256_of_tree

FINGERPRINT_HEX_DIGITS = 16
# YAML keys (dotted) that cannot change any request's tokens, measured or by construction: the
# served name and transport, admission limits, KV capacity (a preempted sequence is recomputed to
# the same bits), prefill chunking and torch's thread count (same logit bits at 1..16 threads and
# any chunking: docs/determinism.md), adaptive k (it chooses only for greedy requests, whose output
# is the target's whatever k), the prefix cache (a cached block holds the same bits as a recomputed
# one: docs/prefix-caching.md). Everything else counts, including keys added after this list.
NOT_OUTPUT_KEYS = frozenset(
    {
        "serving",
        "num_threads",
        "scheduler.max_batch_size",
        "scheduler.max_prefill_tokens_per_step",
        "scheduler.max_waiting",
        "scheduler.max_queue_delay_s",
        "scheduler.adaptive_speculation",
        "scheduler.prefix_caching",
        "target.kv_cache_mb",
        "drafter.kv_cache_mb",
        "drafter.model.kv_cache_mb",
    }
)
# YAML keys (dotted) that decide only what is drafted and how much: they change the text under the
# rejection rule, never under the coupled one (``drafts_change_text``)
DRAFT_KEYS = frozenset({"drafter", "scheduler.max_num_draft_tokens", "scheduler.default_num_draft_tokens"})
# where a model section names files: their digests stand in for them (a path says where, not what)
_FILE_KEYS = ("checkpoint", "tokenizer")
_SOURCE_SUFFIXES = (".py", ".c", ".h")


@dataclass(frozen=True)
class ModelFingerprint:
    """``value``: what responses carry (``model_fingerprint``); ``parts``: what went into it."""

    value: str
    parts: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"model_fingerprint": self.value, **self.parts}, sort_keys=True)


def drafts_change_text(config: SpecDecConfig) -> bool:
    """Whether what is drafted can change a request's text: under the rejection rule (a draft is kept
    with probability min(1, p/q), so a seed's text depends on the drafts), which TensorRT-LLM's
    executor always uses; not under the coupled rule, whose text is plain sampling's."""
    return _drafts_change_text(config.model_dump(mode="json"))


def _drafts_change_text(data: dict[str, Any]) -> bool:
    engine, speculation = data.get("engine") or {}, data.get("speculation") or {}
    return engine.get("kind") == "trtllm" or speculation.get("sampling_rule") == "rejection"


def model_fingerprint(config: SpecDecConfig, isa_dependent: bool = True) -> ModelFingerprint:
    """The fingerprint of the model ``config`` serves on this machine (files hashed at most once).
    ``isa_dependent``: see ``numerics_path``; the served model passes
    ``uses_onednn(runner, drafts_change_text(config))``."""
    models = {"target": config.target}
    if config.drafter.model is not None and drafts_change_text(config):
        models["drafter.model"] = config.drafter.model
    parts = {
        "config": _digest(json.dumps(output_config(config), sort_keys=True)),
        "weights": _digest(" ".join(f"{k}={weights_digest(m, k)}" for k, m in models.items())),
        "tokenizer": _digest(" ".join(f"{k}={tokenizer_digest(m, k)}" for k, m in models.items())),
        "numerics": numerics_path(config, isa_dependent),
        "code": code_digest(),
    }
    if config.drafter.draft_vocab is not None and drafts_change_text(config):
        # which ids the draft head computes comes from this Python's standard library as well
        parts["draft_vocab_corpus"] = corpus_digest(stdlib_corpus())
    value = _digest(json.dumps(parts, sort_keys=True))[:FINGERPRINT_HEX_DIGITS]
    return ModelFingerprint(value, parts)


def output_config(config: SpecDecConfig) -> dict[str, Any]:
    """The config as plain data without ``NOT_OUTPUT_KEYS`` (and ``DRAFT_KEYS`` where drafts do not
    change the text) and without file locations."""
    data = config.model_dump(mode="json")
    left_out = NOT_OUTPUT_KEYS if _drafts_change_text(data) else NOT_OUTPUT_KEYS | DRAFT_KEYS
    for dotted in left_out:
        *parents, leaf = dotted.split(".")
        node: Any = data
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    for section in (data.get("target"), (data.get("drafter") or {}).get("model")):
        if isinstance(section, dict):
            for key in _FILE_KEYS:
                section.pop(key, None)
    return data


def weights_digest(model: ModelConfig, field_name: str) -> str:
    path = resolve_checkpoint(model.checkpoint, f"{field_name}.checkpoint")
    return sha256_of_tree(path) if path.is_dir() else sha256_of(path)


def tokenizer_files(model: ModelConfig, field_name: str) -> list[Path]:
    """The files the model's tokenizer is read from (as ``checkpoints.load_tokenizer`` finds them)."""
    if model.tokenizer is not None:
        return [model.tokenizer]
    weights = resolve_checkpoint(model.checkpoint, f"{field_name}.checkpoint")
    if weights.is_dir():
        return [weights / "tokenizer.json"]
    from trispec.checkpoints import cache_dir
    from trispec.gguf_tokenizer import INFO_FILE, ensure_tokenizer_json, gguf_cache_dir

    # converted from the GGUF once (as loading the model does), so the digest never depends on order
    tokenizer_json = ensure_tokenizer_json(weights, gguf_cache_dir(weights, cache_dir()) / "tokenizer.json")
    return [tokenizer_json, tokenizer_json.with_name(INFO_FILE)]


def tokenizer_digest(model: ModelConfig, field_name: str) -> str:
    return _digest(" ".join(f"{p.name}={sha256_of(p)}" for p in tokenizer_files(model, field_name)))


def numerics_path(config: SpecDecConfig, isa_dependent: bool = True) -> str:
    """Which arithmetic computes the logits, as far as it can change them. ``isa_dependent``: some
    linear layer runs on oneDNN (``uses_onednn``), whose float32 logits differ in their last bits
    between AVX2 and AVX-512; our C kernels (attention, int8, GGUF blocks) give the same bits on
    both, so a model computed only by them is the same model on either (docs/determinism.md)."""
    if config.engine.kind == "trtllm":
        return "tensorrt-llm"
    import torch

    draft = config.drafter.model if drafts_change_text(config) else None
    devices = [config.target.device] + ([draft.device] if draft else [])
    if any(d.startswith("cuda") for d in devices):
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "unavailable"
        return f"cuda {name}, CUDA {torch.version.cuda}"
    from trispec.engine.cpu import linear, paged_attention

    capability = torch.backends.cpu.get_cpu_capability().lower()
    if not paged_attention.kernel_built() or linear._int8_kernel is None:
        # SDPA and torch's int8 matmul instead: not even batch-invariant
        return f"cpu {capability} no-c-kernels"
    if not isa_dependent:
        # AVX2 and AVX-512 measured equal; the baseline copies were not compared with them
        return "cpu " + ("avx2-or-avx512" if capability in ("avx2", "avx512") else capability)
    words = ["cpu", capability]
    if linear._NATIVE_BF16:  # without it bf16 weights are widened to float32 at load
        words.append("bf16")
    if torch.cpu._is_amx_tile_supported():  # oneDNN's bf16 GEMM takes AMX tiles from 33 rows on
        words.append("amx")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if cap:
        words.append(f"onednn<={cap.lower()}")
    return " ".join(words)


def uses_onednn(runner: object, with_drafter: bool = True) -> bool:
    """Whether a linear layer of the loaded target (or, ``with_drafter``, draft) model is one oneDNN
    computes (anything but our GGUF and int8 kernels). A runner this does not know counts as yes.
    ``with_drafter``: whether the draft's numbers can change the text (``drafts_change_text``)."""
    from trispec.engine.cpu.linear import GGUFLinear, Int8Linear

    drafter = getattr(runner, "drafter", None) if with_drafter else None
    engines = [
        getattr(runner, "target", None),
        getattr(drafter, "engine", None),  # a model or self draft
        getattr(getattr(drafter, "model", None), "engine", None),  # the same, beside suffix decoding
    ]
    models = [getattr(e, "model", None) for e in engines if e is not None]
    if not models or not hasattr(models[0], "linears"):
        return True
    return any(
        not isinstance(layer, GGUFLinear | Int8Linear)
        for model in models
        if hasattr(model, "linears")
        for layer in model.linears()
    )


def code_digest() -> str:
    """SHA-256 of the ``trispec`` package's Python and C sources (paths and contents)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES and p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def fingerprint_file(directory: Path, model_name: str) -> Path:
    """Where a served model leaves its fingerprint for ``specdec-serve`` (its heartbeat directory)."""
    return directory / f"{model_name}.fingerprint.json"


def write_fingerprint(directory: Path, model_name: str, text: str) -> None:
    with contextlib.suppress(OSError):  # only the ready line would miss it
        fingerprint_file(directory, model_name).write_text(text)


def read_fingerprint(directory: Path | None, model_name: str) -> dict[str, str] | None:
    if directory is None:
        return None
    try:
        data = json.loads(fingerprint_file(directory, model_name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
