"""One KV-cache budget for two executors: what GPU memory is left for it once both engines' weights
and runtime buffers are on the GPU, split so the draft and the target hold the same number of tokens
(every running sequence needs room in both), from each model's KV bytes per token.

Why the weights come off first: TensorRT-LLM sizes each executor's KV cache inside ``Executor(...)``,
after that engine is loaded, as ``min(max_tokens, fraction x free memory then)`` (kvCacheManager.cpp
``calculateFreeMemBytes``). A budget taken from the memory free before either engine loads counts
the weights twice over, and the executor created second gets less than planned."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class KVSplit:
    tokens: int  # each executor's capacity (KvCacheConfig.max_tokens), a whole number of blocks
    target_bytes: int
    draft_bytes: int
    # what the budget was taken from (0 when the budget was given in GiB without a GPU reading)
    free_bytes: int = 0
    weights_bytes: int = 0
    reserve_bytes: int = 0

    def describe(self) -> str:
        source = ""
        if self.free_bytes:
            source = (
                f" (GPU free {self.free_bytes / GiB:.2f} GiB, engines' weights "
                f"{self.weights_bytes / GiB:.2f} GiB, runtime reserve {self.reserve_bytes / GiB:.2f} GiB)"
            )
        return (
            f"KV cache: {self.tokens} tokens in each executor; target {self.target_bytes / GiB:.2f} GiB, "
            f"draft {self.draft_bytes / GiB:.2f} GiB{source}"
        )


def kv_budget_bytes(
    *,
    free_bytes: int,
    weights_bytes: int,
    reserve_bytes: int,
    gib: float | None = None,
    gpu_fraction: float | None = None,
) -> float:
    """The bytes both KV caches may take together: ``gpu_fraction`` of what stays free once the
    engines' weights and runtime reserve are loaded, or ``gib`` GiB (refused when it cannot fit)."""
    left = free_bytes - weights_bytes - reserve_bytes
    if gib is not None:
        if gib * GiB > left:
            raise ValueError(
                f"trtllm.kv_cache.gib {gib:g} GiB does not fit: {free_bytes / GiB:.2f} GiB free on the GPU "
                f"less {weights_bytes / GiB:.2f} GiB of engine weights and {reserve_bytes / GiB:.2f} GiB of "
                f"runtime reserve leaves {left / GiB:.2f} GiB"
            )
        return gib * GiB
    assert gpu_fraction is not None
    if left <= 0:
        raise ValueError(
            f"no GPU memory left for a KV cache: {free_bytes / GiB:.2f} GiB free, the engines' weights take "
            f"{weights_bytes / GiB:.2f} GiB and trtllm.runtime_reserve_gib {reserve_bytes / GiB:.2f} GiB"
        )
    return gpu_fraction * left


def split_kv_budget(
    budget_bytes: float, target_bytes_per_token: float, draft_bytes_per_token: float, tokens_per_block: int
) -> KVSplit:
    """``draft_bytes_per_token`` 0: no draft engine (a model-free drafter), the target takes it all.

    The largest whole number of blocks ``n`` with ``n * block * (target + draft per token) <= budget``:
    both capacities are equal and their bytes sum to the budget less at most one block of each."""
    if budget_bytes <= 0 or target_bytes_per_token <= 0 or draft_bytes_per_token < 0 or tokens_per_block < 1:
        raise ValueError("the budget, bytes per token and block size must be positive")
    per_block = tokens_per_block * (target_bytes_per_token + draft_bytes_per_token)
    blocks = int(budget_bytes // per_block)
    if blocks < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes / 2**20:.1f} MiB holds no block of {tokens_per_block} tokens "
            f"({per_block / 2**20:.2f} MiB for draft and target)"
        )
    tokens = blocks * tokens_per_block
    return KVSplit(tokens, int(tokens * target_bytes_per_token), int(tokens * draft_bytes_per_token))
