"""The drafter interface.

A drafter proposes up to k tokens for many sequences at once. Model drafters keep their own KV
cache of the verified tokens, filled lazily: a proposal first feeds whatever the cache lacks (the
whole prompt the first time a sequence drafts, less what the draft pool's prefix cache held of it at
``add_sequence``), so a sequence that never drafts (k = 0 under adaptive speculation) costs the draft
model no computation. After
each verify the runner tells them how many tokens of the sequence are verified (``rollback``) and
which (``cache_verified``: their full blocks may then serve later requests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from trispec.engine.base import KVUsage
from trispec.sampling_params import SamplingParams
from trispec.step import PrefixCacheReset

if TYPE_CHECKING:
    from trispec.guided.state import GrammarState


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int
    # every verified token of the sequence so far: prompt + output
    token_ids: Sequence[int]
    num_draft_tokens: int
    sampling: SamplingParams
    generator: torch.Generator | None
    # drafts this round already has (the tokens a grammar forces): the proposal continues after them
    # and does not repeat them; a drafter that cannot continue from unverified tokens proposes nothing
    prefix: Sequence[int] = ()
    # a guided request's grammar: every draft must be a token it allows (``GrammarState.mask_logits``)
    guide: GrammarState | None = None

    @property
    def output_position(self) -> int:
        """The output position of the first draft (the keyed noise's position, sampling/noise.py)."""
        return len(self.token_ids) + len(self.prefix) - self.sampling.prompt_len


@dataclass(frozen=True)
class DraftProposal:
    tokens: list[int]
    # the distributions the tokens were drawn from, [len(tokens), vocab], for the rejection rule;
    # None otherwise (greedy, the coupled rule)
    probs: torch.Tensor | None = None
    # verified tokens a model drafter fed beyond the usual one or two (its cache catching up): such a
    # round's draft time says little about the cost of a draft step
    catch_up_tokens: int = 0


class Drafter(Protocol):
    def room_for(self, lengths: Mapping[int, int]) -> bool:
        """Whether the draft cache can grow every sequence named to its length at once (always for
        drafters without a cache)."""
        ...

    def add_sequence(
        self, seq_id: int, max_length: int, cache_salt: str = "", token_ids: Sequence[int] = ()
    ) -> int:
        """Register a sequence of verified ``token_ids``; returns how many of them its draft cache
        holds already (0 without one). A model drafter takes what its pool's prefix cache holds of
        them (blocks shared only with sequences of the same ``cache_salt``) and further KV blocks only
        as it drafts."""
        ...

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]: ...

    def rollback(self, seq_id: int, num_verified: int) -> None:
        """The sequence's first ``num_verified`` tokens are verified; forget anything past them."""
        ...

    def cached_length(self, seq_id: int) -> int:
        """Tokens of the sequence its draft cache holds (0 without one): what a failed round's undo
        rolls it back to."""
        ...

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """The sequence's verified tokens so far (after ``rollback``): what the draft cache holds of
        them may serve later sequences with the same prefix."""
        ...

    def free(self, seq_id: int) -> None: ...

    def kv_usage(self) -> KVUsage | None:
        """The draft model's KV pool; None for drafters without one (n-gram)."""
        ...

    def reset_prefix_cache(self) -> PrefixCacheReset | None:
        """Empty the draft model's prefix cache (``Engine.reset_prefix_cache``); None without one."""
        ...


class StatelessDrafter:
    """Bookkeeping for a drafter without a model or KV cache (n-gram lookup, none): admission always
    succeeds and there is no cache to feed, roll back or free. Subclasses implement ``propose``."""

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        return True

    def add_sequence(
        self, seq_id: int, max_length: int, cache_salt: str = "", token_ids: Sequence[int] = ()
    ) -> int:
        return 0

    def rollback(self, seq_id: int, num_verified: int) -> None:
        pass

    def cached_length(self, seq_id: int) -> int:
        return 0

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        pass

    def free(self, seq_id: int) -> None:
        pass

    def kv_usage(self) -> KVUsage | None:
        return None

    def reset_prefix_cache(self) -> PrefixCacheReset | None:
        return None
