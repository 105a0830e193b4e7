"""TensorRT-LLM engine directories: what their ``config.json`` says, and whether a draft and a target
engine fit together for external-draft speculation. Plain JSON: no TensorRT-LLM needed, so the same
check runs at build time (``specdec-build``, ``specdec-build check-engines``) and before serving.

``config.json`` is ``EngineConfig.to_dict()`` of TensorRT-LLM <= 1.2.x: ``{"version", "pretrained_config":
{..., "mapping": {...}}, "build_config": {..., "plugin_config": {...}}}``. Fields vary by version, so
everything is read with defaults. What a bad pairing looks like at run time is a confusing executor
error (tensorrtllm_backend #473: "Number of draft tokens (56) is larger than maximum number of draft
tokens (0)"); here it is one line naming the key and both values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tensorrt_llm.models.modeling_utils.SpeculativeDecodingMode (an IntFlag): JSON may hold the value
# or the name
SPEC_MODES = {
    1: "NONE",
    2: "DRAFT_TOKENS_EXTERNAL",
    4: "MEDUSA",
    8: "LOOKAHEAD_DECODING",
    16: "EXPLICIT_DRAFT_TOKENS",
    32: "EAGLE",
    64: "NGRAM",
    128: "USER_PROVIDED",
}
KV_QUANT_BYTES = {"INT8": 1, "FP8": 1, "NVFP4": 0.5}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}


class EngineConfigError(ValueError):
    """An engine directory is missing, unreadable or not a TensorRT-LLM engine."""


def spec_mode_name(value: object) -> str:
    """``2`` / ``"DRAFT_TOKENS_EXTERNAL"`` / ``"draft_tokens_external"`` /
    ``"SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL"`` -> ``"DRAFT_TOKENS_EXTERNAL"``."""
    if value is None:
        return "NONE"
    if isinstance(value, bool):
        raise EngineConfigError(f"speculative_decoding_mode {value!r} is not a mode")
    if isinstance(value, int):
        return SPEC_MODES.get(value, f"UNKNOWN({value})")
    text = str(value).rsplit(".", 1)[-1].upper()
    return SPEC_MODES.get(int(text), text) if text.isdigit() else text


@dataclass(frozen=True)
class EngineInfo:
    path: Path
    version: str
    architecture: str
    dtype: str
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_size: int
    tp_size: int
    pp_size: int
    speculative_decoding_mode: str
    max_draft_len: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int | None
    paged_kv_cache: bool
    use_paged_context_fmha: bool
    remove_input_padding: bool
    tokens_per_block: int
    kv_cache_bytes_per_element: float

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def usable_seq_len(self) -> int:
        """The ``--max_seq_len`` the engine was built with: for an external-draft target,
        trtllm-build adds ``max_draft_len`` to it before writing config.json."""
        extra = self.max_draft_len if self.speculative_decoding_mode == "DRAFT_TOKENS_EXTERNAL" else 0
        return self.max_seq_len - extra

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token takes on one GPU: layers x KV heads x head size x (K and V) x
        element size, the heads split across tensor-parallel ranks (layers across pipeline ranks)."""
        heads = max(self.num_kv_heads // self.tp_size, 1)
        layers = -(-self.num_layers // self.pp_size)
        return layers * heads * self.head_size * 2 * self.kv_cache_bytes_per_element


def read_engine(path: str | Path) -> EngineInfo:
    path = Path(path)
    config_path = path / "config.json"
    try:
        raw = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise EngineConfigError(f"{path}: no config.json (not a TensorRT-LLM engine directory)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineConfigError(f"{config_path}: cannot read: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("pretrained_config"), dict):
        raise EngineConfigError(f"{config_path}: no pretrained_config (not an engine's config.json)")
    pre: dict[str, Any] = raw["pretrained_config"]
    build: dict[str, Any] = raw.get("build_config") or {}
    plugin: dict[str, Any] = build.get("plugin_config") or {}
    mapping: dict[str, Any] = pre.get("mapping") or {}
    quant: dict[str, Any] = pre.get("quantization") or {}
    heads = int(pre.get("num_attention_heads", 1))
    hidden = int(pre.get("hidden_size", 0))
    dtype = str(pre.get("dtype", "float16"))
    kv_algo = str(quant.get("kv_cache_quant_algo") or "").upper()
    kv_type = str(build.get("kv_cache_type") or "").rsplit(".", 1)[-1].upper()
    max_seq_len = int(build.get("max_seq_len") or 0)
    try:
        return EngineInfo(
            path=path,
            version=str(raw.get("version", "unknown")),
            architecture=str(pre.get("architecture", "unknown")),
            dtype=dtype,
            vocab_size=int(pre["vocab_size"]),
            num_layers=int(pre.get("num_hidden_layers", 0)),
            num_kv_heads=int(pre.get("num_key_value_heads") or heads),
            head_size=int(pre.get("head_size") or (hidden // heads if heads else 0)),
            tp_size=int(mapping.get("tp_size", 1)),
            pp_size=int(mapping.get("pp_size", 1)),
            speculative_decoding_mode=spec_mode_name(build.get("speculative_decoding_mode")),
            max_draft_len=int(build.get("max_draft_len") or 0),
            max_batch_size=int(build.get("max_batch_size") or 0),
            max_input_len=int(build.get("max_input_len") or 0),
            max_seq_len=max_seq_len,
            max_num_tokens=int(build["max_num_tokens"]) if build.get("max_num_tokens") else None,
            # kv_cache_type (newer) or plugin_config.paged_kv_cache (older)
            paged_kv_cache=kv_type == "PAGED" if kv_type else bool(plugin.get("paged_kv_cache", False)),
            use_paged_context_fmha=bool(plugin.get("use_paged_context_fmha", False)),
            remove_input_padding=bool(plugin.get("remove_input_padding", False)),
            tokens_per_block=int(plugin.get("tokens_per_block") or 32),
            kv_cache_bytes_per_element=KV_QUANT_BYTES.get(kv_algo, DTYPE_BYTES.get(dtype, 2)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineConfigError(f"{config_path}: unreadable field: {exc}") from None


def check_pair(draft: EngineInfo | None, target: EngineInfo, num_draft_tokens: int) -> list[str]:
    """Every reason the pair cannot serve external-draft speculation with up to ``num_draft_tokens``
    drafts per round, one line each naming the key and the values (empty: they fit). ``draft`` None:
    a model-free drafter feeds the target."""
    problems: list[str] = []
    engines = {"target": target} if draft is None else {"draft": draft, "target": target}

    def values(attr: str) -> str:
        return ", ".join(f"{role} {getattr(e, attr)!r}" for role, e in engines.items())

    for key, attr in (
        ("build_config.plugin_config.use_paged_context_fmha", "use_paged_context_fmha"),
        ("build_config.kv_cache_type", "paged_kv_cache"),
        ("build_config.plugin_config.remove_input_padding", "remove_input_padding"),
    ):
        if not all(getattr(e, attr) for e in engines.values()):
            need = "PAGED" if attr == "paged_kv_cache" else "true"
            problems.append(f"{key}: {values(attr)} (must be {need} on {' and '.join(engines)})")
    if target.speculative_decoding_mode != "DRAFT_TOKENS_EXTERNAL":
        problems.append(
            f"build_config.speculative_decoding_mode: target {target.speculative_decoding_mode} "
            "(build the target with --speculative_decoding_mode draft_tokens_external)"
        )
    if target.max_num_tokens is not None and target.max_num_tokens <= num_draft_tokens:
        problems.append(
            f"build_config.max_num_tokens: target {target.max_num_tokens} cannot hold one verify step of "
            f"{num_draft_tokens} drafts + 1 (rebuild with a larger --max_num_tokens)"
        )
    if target.max_draft_len < num_draft_tokens:
        problems.append(
            f"build_config.max_draft_len: target {target.max_draft_len} < {num_draft_tokens} draft tokens "
            f"per round (rebuild with --max_draft_len {num_draft_tokens}, or lower the draft tokens)"
        )
    for role, e in engines.items():
        if e.max_input_len > e.max_seq_len:
            problems.append(
                f"build_config.max_input_len: {role} {e.max_input_len} > its max_seq_len {e.max_seq_len}"
            )
    if draft is not None:
        if draft.vocab_size != target.vocab_size:
            problems.append(
                f"pretrained_config.vocab_size: draft {draft.vocab_size} != target {target.vocab_size} "
                "(draft token ids and logits would be meaningless)"
            )
        if draft.speculative_decoding_mode != "NONE":
            problems.append(
                f"build_config.speculative_decoding_mode: draft {draft.speculative_decoding_mode} "
                "(the draft must be a plain engine)"
            )
        # every round sends the draft the whole sequence: it must take what the target takes (the
        # target's max_seq_len as built: config.json's holds max_draft_len more, see usable_seq_len)
        for key in ("max_input_len", "max_seq_len", "max_batch_size"):
            target_value = target.usable_seq_len if key == "max_seq_len" else getattr(target, key)
            if getattr(draft, key) < target_value:
                problems.append(f"build_config.{key}: draft {getattr(draft, key)} < target {target_value}")
    return problems


def context_limit(
    draft: EngineInfo | None, target: EngineInfo, num_draft_tokens: int, *, chunked_context: bool = True
) -> tuple[int, str]:
    """Longest sequence (prompt + output) the pair serves, and the engine key that bounds it.

    Every round re-sends the whole sequence (up to ``limit - 1`` tokens) to both engines, and
    ``LlmRequest::validate`` (TensorRT-LLM batch_manager/llmRequest.cpp) edits what does not fit
    instead of refusing it: drafts past the target's max_input_len are silently cut, so the target
    takes ``max_input_len - k`` tokens of sequence. The draft takes its max_input_len and must hold
    its k drafts within its max_seq_len; the target's usable max_seq_len (config.json holds
    max_draft_len more, see usable_seq_len) bounds the total. Without chunked context a context plus
    its drafts must also fit max_num_tokens, or the executor fails every request in flight
    (microBatchScheduler.cpp "The number of context tokens")."""
    k = num_draft_tokens
    bounds = [
        (
            target.max_input_len - k + 1,
            f"target build_config.max_input_len {target.max_input_len} - {k} drafts",
        ),
        (target.usable_seq_len, f"target build_config.max_seq_len {target.usable_seq_len}"),
    ]
    if draft is not None:
        bounds.append((draft.max_input_len + 1, f"draft build_config.max_input_len {draft.max_input_len}"))
        bounds.append(
            (draft.max_seq_len - k + 1, f"draft build_config.max_seq_len {draft.max_seq_len} - {k} drafts")
        )
    if not chunked_context:
        for role, engine, drafts in (("target", target, k), ("draft", draft, 0)):
            if engine is not None and engine.max_num_tokens is not None:
                bounds.append(
                    (
                        engine.max_num_tokens - drafts + 1,
                        f"{role} build_config.max_num_tokens {engine.max_num_tokens}"
                        + (f" - {drafts} drafts" if drafts else "")
                        + " (trtllm.chunked_context is off: a whole context must fit one engine step)",
                    )
                )
    tokens, reason = min(bounds, key=lambda bound: bound[0])
    return max(tokens, 1), reason


def max_context(
    draft: EngineInfo | None, target: EngineInfo, num_draft_tokens: int, *, chunked_context: bool = True
) -> int:
    return context_limit(draft, target, num_draft_tokens, chunked_context=chunked_context)[0]


def refusal(length: int, target: EngineInfo, draft: EngineInfo | None, chunked_context: bool) -> str | None:
    """Why a sequence of ``length`` tokens cannot be sent (None: it can). Sent, TensorRT-LLM would fail
    it (over max_input_len) or every request in flight with it (a context over max_num_tokens without
    chunked context): the runner fails it alone instead."""
    for role, engine in (("target", target), ("draft", draft)):
        if engine is None:
            continue
        if length > engine.max_input_len:
            return f"{length} tokens exceed the {role} engine's max_input_len ({engine.max_input_len})"
        if not chunked_context and engine.max_num_tokens is not None and length > engine.max_num_tokens:
            return (
                f"a context of {length} tokens does not fit the {role} engine's max_num_tokens "
                f"({engine.max_num_tokens}) with trtllm.chunked_context off"
            )
    return None


def draft_room(
    length: int, wanted: int, target: EngineInfo, draft: EngineInfo | None, chunked_context: bool
) -> int:
    """How many of ``wanted`` drafts TensorRT-LLM would keep for a sequence of ``length`` tokens
    (``LlmRequest::validate`` cuts drafts past max_input_len and lowers max_tokens past max_seq_len,
    config.json's value), so that what is counted as drafted is what was verified."""
    room = min(
        wanted,
        target.max_draft_len,
        target.max_input_len - length,
        (target.max_seq_len - length - 1) // 2,  # prompt + (k + 1) new + k drafts
    )
    if not chunked_context and target.max_num_tokens is not None:
        room = min(room, target.max_num_tokens - length)
    if draft is not None:
        room = min(room, draft.max_seq_len - length)
    return max(room, 0)


def engine_weight_bytes(path: Path) -> int:
    """What one GPU holds of an engine's weights: its largest ``rank<r>.engine`` file (each rank of a
    tensor-parallel engine runs on its own GPU); 0 when the directory has none."""
    return max((f.stat().st_size for f in Path(path).glob("rank*.engine")), default=0)
