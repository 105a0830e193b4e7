"""A model drafter with suffix decoding beside it. Suffix proposals cost next to nothing, so each
round a request first asks the suffix index; where that proposes the full k tokens (a confident,
long match: it stops early on doubt) the request skips the draft model this round, else the model
drafts as usual. The choice depends only on the request's verified tokens, never on the model's
random draws, so sampling stays exact; a skipped model catches up on its next propose (it feeds
whatever its cache lacks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trispec.drafters.base import DraftProposal, DraftRequest
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.engine.base import KVUsage
from trispec.step import PrefixCacheReset


class WithSuffix:
    def __init__(self, model: ModelDrafter, suffix: SuffixDrafter) -> None:
        self.model = model
        self.suffix = suffix
        # rounds whose proposal came from the suffix index / from the model, for benchmarks
        self.num_suffix_proposals = 0
        self.num_model_proposals = 0

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        return self.model.room_for(lengths)

    def add_sequence(
        self, seq_id: int, max_length: int, cache_salt: str = "", token_ids: Sequence[int] = ()
    ) -> int:
        self.suffix.add_sequence(seq_id, max_length, cache_salt, token_ids)
        return self.model.add_sequence(seq_id, max_length, cache_salt, token_ids)

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = self.suffix.propose(requests)
        need_model = [
            i
            for i, (r, p) in enumerate(zip(requests, proposals))
            if r.num_draft_tokens > 0 and len(p.tokens) < r.num_draft_tokens
        ]
        if need_model:
            for i, proposal in zip(need_model, self.model.propose([requests[i] for i in need_model])):
                proposals[i] = proposal
        self.num_model_proposals += len(need_model)
        self.num_suffix_proposals += sum(r.num_draft_tokens > 0 for r in requests) - len(need_model)
        return proposals

    def rollback(self, seq_id: int, num_verified: int) -> None:
        self.model.rollback(seq_id, num_verified)

    def cached_length(self, seq_id: int) -> int:
        return self.model.cached_length(seq_id)

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        self.model.cache_verified(seq_id, token_ids)

    def free(self, seq_id: int) -> None:
        self.model.free(seq_id)
        self.suffix.free(seq_id)

    def kv_usage(self) -> KVUsage | None:
        return self.model.kv_usage()

    def reset_prefix_cache(self) -> PrefixCacheReset | None:
        return self.model.reset_prefix_cache()
