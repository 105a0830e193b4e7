"""One KV-cache budget for two executors: split so the draft and the target hold the same number of
tokens (every running sequence needs room in both), from each model's KV bytes per token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVSplit:
    tokens: int  # each executor's capacity (KvCacheConfig.max_tokens), a whole number of blocks
    target_bytes: int
    draft_bytes: int

    def describe(self) -> str:
        return (
            f"KV cache: {self.tokens} tokens in each executor; target {self.target_bytes / 2**30:.2f} GiB, "
            f"draft {self.draft_bytes / 2**30:.2f} GiB"
        )


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
