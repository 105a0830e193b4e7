"""The engine interface the scheduler and drafters talk to.

An engine owns one model and its KV cache. A sequence's cache holds the keys/values of the tokens
it has been fed so far (``cached_length``); ``forward`` appends new tokens for many sequences in one
batched, ragged call (each sequence its own number of new tokens and its own length) and returns
logits for the last ``num_logits`` new tokens of each; ``truncate`` rolls a sequence back.
Prefix cache: ``cache_verified`` says which tokens of a sequence are verified (their full blocks are
kept for reuse), ``reuse_prefix`` gives a sequence the cached blocks that continue it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from trispec.step import KVCacheMetrics, KVUsage, PrefixCacheReset


@dataclass(frozen=True)
class ForwardInput:
    """New tokens for one sequence. Positions continue from the sequence's cached length."""

    seq_id: int
    token_ids: Sequence[int]
    # Logits are returned for the last ``num_logits`` of ``token_ids`` (0: none, e.g. a prefill chunk).
    num_logits: int


@runtime_checkable
class Engine(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generated + drafts in flight) one sequence may hold."""
        ...

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        """Whether the free KV blocks let every sequence named grow to its length at once (a sequence
        not registered yet counts from zero). KV blocks are taken as tokens arrive, not reserved."""
        ...

    def add_sequence(self, seq_id: int, max_length: int, cache_salt: str = "") -> None:
        """Register a sequence that may hold up to ``max_length`` tokens; it takes no KV block yet. It
        shares cached blocks only with sequences of the same ``cache_salt``."""
        ...

    def probe_prefix(self, token_ids: Sequence[int], cache_salt: str = "") -> tuple[int, int]:
        """For a sequence not registered yet: (tokens ``reuse_prefix`` would find cached, blocks of
        them that would leave the free count), changing nothing."""
        ...

    def reuse_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Extend the sequence (whose tokens are ``token_ids``) with cached blocks that continue it, at
        most up to its last token; returns its cached length."""
        ...

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """The sequence's first ``len(token_ids)`` cached tokens are verified and are these: their full
        blocks may be shared from now on."""
        ...

    def kv_cache_metrics(self, seq_id: int) -> KVCacheMetrics | None:
        """What the sequence's context (its tokens at its first ``reuse_prefix``) found cached and
        took from the pool; None before it looked."""
        ...

    def cached_length(self, seq_id: int) -> int: ...

    def forward(self, inputs: Sequence[ForwardInput]) -> list[torch.Tensor]:
        """Append each input's tokens to its sequence's cache in ONE batched pass.

        Returns one float32 tensor per input, shape ``[num_logits, vocab_size]`` (``[0, vocab]`` when
        no logits were asked for), in the order of ``inputs``.
        """
        ...

    def truncate(self, seq_id: int, length: int) -> None:
        """Roll back: keep the first ``length`` cached tokens, free whole blocks no longer needed."""
        ...

    def free(self, seq_id: int) -> None:
        """Forget the sequence and return all its blocks to the pool."""
        ...

    def kv_usage(self) -> KVUsage: ...

    def reset_prefix_cache(self) -> PrefixCacheReset:
        """Empty the prefix cache (cached blocks emptied, held ones found by no later sequence)
        without touching a running sequence (``BlockManager.reset_prefix_cache``)."""
        ...
