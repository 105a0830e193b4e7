"""``TorchEngine``: the PyTorch implementation of the ``Engine`` protocol (CPU; CUDA by config).

One engine = one model + one paged KV pool. ``forward`` packs the new tokens of all inputs into one
ragged batch (see ``model.Transformer``); the ``BlockManager`` hands out cache blocks as tokens
arrive. The scheduler checks ``room_for`` before each step (preempting when the pool is short), so a
forward that runs the pool dry is a bug; it raises ``CapacityError`` and leaves the cache untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trispec.engine.args import ModelArgs
from trispec.engine.base import ForwardInput, KVCacheMetrics, KVUsage
from trispec.engine.batch import SeqSpec
from trispec.engine.build import build_transformer
from trispec.engine.kv_cache import BlockManager, KVCache, slots_of
from trispec.engine.model import Transformer
from trispec.engine.random_weights import random_state_dict
from trispec.errors import ConfigError, InvalidInputError
from trispec.step import PrefixCacheReset

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None, weight_quant: str | None) -> torch.dtype:
    """``None``: float32, or bfloat16 for int8 weights (the int8 kernel is only fast with bf16)."""
    if dtype is None:
        return torch.bfloat16 if weight_quant == "int8" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ConfigError("dtype", f"unsupported dtype {dtype} (float32, bfloat16)")
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError("dtype", f"unsupported dtype {dtype!r} (float32, bfloat16)")
    return _DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", f"{device}: no CUDA device is available to this torch build")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError("device", f"unsupported device {device!r} (cpu, cuda, cuda:N)")
    return dev


class TorchEngine:
    """Llama/Qwen2 with a paged KV cache. Build with ``from_checkpoint`` / ``from_random``."""

    def __init__(
        self,
        model: Transformer,
        *,
        kv_cache_mb: float = 256.0,
        num_blocks: int | None = None,
        block_size: int = 16,
        max_context: int | None = None,
        prefix_caching: bool = True,
        namespace: str = "",
    ) -> None:
        args = model.args
        self.model = model
        self.args: ModelArgs = args
        self.dtype = model.dtype
        if block_size < 1:
            raise ConfigError("block_size", f"must be >= 1, got {block_size}")
        geometry = {
            "num_layers": args.num_layers,
            "block_size": block_size,
            "num_kv_heads": args.num_kv_heads,
            "head_dim": args.head_dim,
            "dtype": self.dtype,
        }
        if num_blocks is None:
            num_blocks = KVCache.num_blocks_for_budget(kv_cache_mb, **geometry)
        # what, besides the tokens, decides a block's KV in this pool (prefix_digest.py)
        identity = f"{args}|{self.dtype}|{namespace}".encode()
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching, namespace=identity)
        # one block more than the manager hands out: the trash block, where padding rows of the
        # static (CUDA-graph) step write their keys and values and padded block tables point
        self.kv = KVCache(num_blocks=num_blocks + 1, device=model.embed.device, **geometry)
        self.trash_block = num_blocks
        capacity = num_blocks * block_size
        if max_context is None:
            max_context = min(args.max_position_embeddings, capacity)
        elif not 1 <= max_context <= capacity:
            raise ConfigError(
                "max_context", f"{max_context} must be in [1, {capacity}] (KV pool capacity in tokens)"
            )
        if max_context > model.cos.shape[0]:
            raise ConfigError("max_context", f"{max_context} exceeds the RoPE table ({model.cos.shape[0]})")
        self._max_context = max_context

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def from_state_dict(
        cls,
        args: ModelArgs,
        state_dict: Mapping[str, torch.Tensor],
        *,
        dtype: str | torch.dtype | None = None,
        weight_quant: str | None = None,
        kv_cache_mb: float = 256.0,
        num_blocks: int | None = None,
        block_size: int = 16,
        max_context: int | None = None,
        attention: str = "auto",
        device: str | torch.device = "cpu",
        prefix_caching: bool = True,
        head_ids: torch.Tensor | None = None,
    ) -> TorchEngine:
        """From a HF-named state dict (``model.embed_tokens.weight``, ``model.layers.0...``).

        ``dtype``: "float32" | "bfloat16" (weights, activations and KV cache); ``None`` means float32,
        or bfloat16 with ``weight_quant="int8"`` (the int8 kernel wants bf16 activations).
        ``weight_quant="int8"``: weight-only int8, per-output-channel scales (the self-draft).
        KV pool: ``num_blocks`` blocks of ``block_size`` tokens, else as many as fit ``kv_cache_mb``.
        ``max_context`` defaults to min(max_position_embeddings, pool capacity in tokens).
        ``attention``: "auto" (the batch-invariant kernel where it runs, else SDPA), "paged", "sdpa".
        ``device``: "cpu" or a CUDA device; weights, KV pool and activations live there, logits come
        back to the host (sampling and acceptance run there).
        ``prefix_caching``: keep full blocks of verified tokens for later sequences with the same
        prefix (``block_manager.py``).
        ``head_ids``: the LM head computes only these token ids (sorted; a draft's ``draft_vocab``,
        ``drafters/draft_vocab.py``); the logits of the others are -inf.
        """
        dt = resolve_dtype(dtype, weight_quant)
        dev = resolve_device(device)
        rope_length = max(args.max_position_embeddings, max_context or 0)
        model = build_transformer(
            args,
            state_dict,
            dtype=dt,
            weight_quant=weight_quant,
            rope_length=rope_length,
            attention=attention,
            device=dev,
            head_ids=head_ids,
        )
        return cls(
            model,
            kv_cache_mb=kv_cache_mb,
            num_blocks=num_blocks,
            block_size=block_size,
            max_context=max_context,
            prefix_caching=prefix_caching,
            namespace=f"{weight_quant}|{attention}",
        )

    @classmethod
    def from_random(cls, args: ModelArgs, seed: int, **kwargs: Any) -> TorchEngine:
        """Deterministic random weights (same seed -> same weights -> same logits); keywords as
        ``from_state_dict``. On a GPU they are drawn there in the engine's dtype, tensor by tensor
        (``random_weights.device_state_dict``: other values than the host's for the same seed)."""
        device = resolve_device(kwargs.get("device", "cpu"))
        if device.type == "cpu":
            return cls.from_state_dict(args, random_state_dict(args, seed), **kwargs)
        from trispec.engine.random_weights import device_state_dict

        dtype = resolve_dtype(kwargs.get("dtype"), kwargs.get("weight_quant"))
        return cls.from_state_dict(args, device_state_dict(args, seed, device, dtype), **kwargs)

    @classmethod
    def from_checkpoint(cls, path: str | Path, **kwargs: Any) -> TorchEngine:
        """From a GGUF file or a HF safetensors directory (config.json + *.safetensors); keywords as
        ``from_state_dict``."""
        from trispec.engine.weights import load_checkpoint

        args, state_dict = load_checkpoint(path)
        return cls.from_state_dict(args, state_dict, **kwargs)

    # -- Engine protocol -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def head_vocab(self) -> int:
        """How many token ids get logits; the rest -inf (``head_ids``)."""
        return self.model.lm_head.out_features

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        return all(n <= self._max_context for n in lengths.values()) and self.blocks.room_for(lengths)

    def add_sequence(self, seq_id: int, max_length: int, cache_salt: str = "") -> None:
        if not 1 <= max_length <= self._max_context:
            raise InvalidInputError("max_length", f"{max_length} must be in [1, {self._max_context}]")
        self.blocks.add(seq_id, max_length, cache_salt)

    def probe_prefix(self, token_ids: Sequence[int], cache_salt: str = "") -> tuple[int, int]:
        blocks, claimed = self.blocks.probe(token_ids, cache_salt)
        return blocks * self.block_size, claimed

    @torch.inference_mode()
    def reuse_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        match = self.blocks.match(seq_id, token_ids)
        if match.copy_tokens:  # a partial hit: the first keys and values of a cached block
            bs = self.block_size
            src = torch.arange(match.copy_from * bs, match.copy_from * bs + match.copy_tokens)
            dst = torch.arange(match.copy_to * bs, match.copy_to * bs + match.copy_tokens)
            src, dst = src.to(self.kv.k.device), dst.to(self.kv.k.device)
            for cache in (self.kv.k, self.kv.v):
                cache.index_copy_(2, dst, cache.index_select(2, src))
        return match.length

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        self.blocks.seal(seq_id, token_ids)

    def drop_prefix_cache(self) -> None:
        """Forget the cached blocks no sequence holds (benchmarks: every arm starts cold)."""
        self.blocks.drop_cached()

    def reset_prefix_cache(self) -> PrefixCacheReset:
        return self.blocks.reset_prefix_cache()

    def kv_cache_metrics(self, seq_id: int) -> KVCacheMetrics | None:
        context = self.blocks.context_blocks(seq_id)
        if context is None:
            return None
        return KVCacheMetrics(
            context.reused, context.missed, context.new, context.taken, context.reused_tokens
        )

    def cached_length(self, seq_id: int) -> int:
        return self.blocks.length(seq_id)

    @torch.inference_mode()
    def forward(self, inputs: Sequence[ForwardInput]) -> list[torch.Tensor]:
        self._validate(inputs)
        starts = [self.blocks.length(inp.seq_id) for inp in inputs]
        specs = []
        try:
            for inp, start in zip(inputs, starts, strict=True):
                self.blocks.append(inp.seq_id, len(inp.token_ids))
                specs.append(
                    SeqSpec(inp.token_ids, start, self.blocks.block_table(inp.seq_id), inp.num_logits)
                )
            if sum(len(inp.token_ids) for inp in inputs) == 0:
                return [torch.zeros(0, self.vocab_size) for _ in inputs]
            batch, spans = self.model.make_batch(specs, self.blocks.block_size)
            logits = self.model.forward(batch, self.kv)
            if logits.device.type != "cpu":
                logits = logits.cpu()  # one copy per forward; the runner samples on the host
        except BaseException:
            # Leave the cache as it was: lengths back, freshly taken blocks returned.
            for inp, start in zip(inputs[: len(specs)], starts, strict=False):
                self.blocks.truncate(inp.seq_id, start)
            raise
        if len(spans) == 1 and spans[0][1] == logits.shape[0]:
            return [logits]  # one sequence, every row (no view: a decode step's host time)
        return [logits[r0 : r0 + count] for r0, count in spans]

    def _validate(self, inputs: Sequence[ForwardInput]) -> None:
        seen: set[int] = set()
        vocab = self.vocab_size
        for inp in inputs:
            sid = inp.seq_id
            if sid not in self.blocks:
                raise ValueError(f"unknown seq_id {sid}")
            if sid in seen:
                raise ValueError(f"seq_id {sid} appears twice in one forward")
            seen.add(sid)
            n = len(inp.token_ids)
            if not 0 <= inp.num_logits <= n:
                raise ValueError(f"seq {sid}: num_logits {inp.num_logits} not in [0, {n}]")
            total = self.blocks.length(sid) + n
            if total > self.blocks.max_length(sid):
                raise ValueError(f"seq {sid}: {total} tokens exceed its cap of {self.blocks.max_length(sid)}")
            if n and not (min(inp.token_ids) >= 0 and max(inp.token_ids) < vocab):
                raise ValueError(f"seq {sid}: token id out of range [0, {vocab})")

    def truncate(self, seq_id: int, length: int) -> None:
        self.blocks.truncate(seq_id, length)

    def same_kv_geometry(self, other: TorchEngine) -> bool:
        """Whether ``other``'s keys and values fit this engine's cache (layers, heads, head size)."""
        mine, theirs = self.kv.k.shape, other.kv.k.shape
        return (mine[0], mine[1], mine[3]) == (theirs[0], theirs[1], theirs[3])

    @torch.inference_mode()
    def import_kv(self, seq_id: int, source: TorchEngine, length: int) -> None:
        """Extend the sequence's cache to ``length`` tokens with ``source``'s keys and values for
        them (same KV geometry; converted to this cache's dtype). For a self-draft: its cache takes
        the target's instead of feeding the verified tokens through the draft model again."""
        start = self.blocks.length(seq_id)
        if length <= start:
            return
        if length > source.blocks.length(seq_id):
            raise ValueError(
                f"seq {seq_id}: the source holds {source.blocks.length(seq_id)} tokens, not {length}"
            )
        self.blocks.append(seq_id, length - start)
        positions = range(start, length)
        src = torch.tensor(slots_of(source.blocks.block_table(seq_id), source.block_size, positions))
        dst = torch.tensor(slots_of(self.blocks.block_table(seq_id), self.block_size, positions))
        src, dst = src.to(source.kv.k.device), dst.to(self.kv.k.device)
        for mine, theirs in ((self.kv.k, source.kv.k), (self.kv.v, source.kv.v)):
            mine.index_copy_(2, dst, theirs.index_select(2, src).to(mine.dtype))

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)

    def kv_usage(self) -> KVUsage:
        counters = self.blocks.counters
        return KVUsage(
            total_blocks=self.blocks.num_blocks,
            used_blocks=self.blocks.used_blocks,
            block_size=self.blocks.block_size,
            cached_blocks=self.blocks.cached_blocks,
            queried_tokens=counters.queried_tokens,
            hit_tokens=counters.hit_tokens,
            evicted_blocks=counters.evicted_blocks,
        )
