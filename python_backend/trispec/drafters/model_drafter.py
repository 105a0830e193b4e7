"""Draft with a model on any engine: a smaller checkpoint, or the target's own weights at lower
precision (self-draft). All sequences draft together, one batched forward per draft position.

A draft cache fills lazily: a sequence that did not draft for a while first feeds what it missed
(the whole prompt, the first time). A self-draft has the target's architecture, so it takes the
target's keys and values for those tokens instead (``kv_source``): the same layers would compute
nearly the same ones, and a copy costs a millisecond where feeding a prompt through the draft model
cost as much as the target's own prefill on a 2-core CPU; in the round where the target itself first
sees them (a prompt riding along with the verify pass) it drafts nothing. Not for requests whose
output depends on their drafts (the rejection rule, seeded): what a copy brings depends on how the
target's prefill was chunked, which depends on the batch, and their draws must not.

Otherwise a lagging draft cache first takes what the draft pool's prefix cache holds of the sequence
(full blocks of verified tokens the draft model computed for earlier requests with the same prefix
and cache salt), and feeds only the rest. Blocks a self-draft copied from the target are never
shared: their keys and values are the target's, not what the draft model computes.

A sampled request's draft token is drawn as the target will draw its own: under the coupled rule the
perturbed argmax of the draft's logits with the request's keyed noise at that output position
(sampling/coupled.py), under the rejection rule a sample of its distribution q, which goes along."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from trispec.drafters.base import DraftProposal, DraftRequest
from trispec.engine.base import Engine, ForwardInput, KVUsage
from trispec.engine.torch_engine import TorchEngine
from trispec.logits_rules import apply_rules
from trispec.sampling import coupled_tokens, logits_to_probs, sample
from trispec.step import PrefixCacheReset

# tokens a draft model feeds at its first position in a steady round: the last verified token, and
# the last accepted draft when every draft was accepted
MAX_OWN_FEED = 2


class ModelDrafter:
    def __init__(self, engine: Engine, kv_source: TorchEngine | None = None) -> None:
        if kv_source is not None and not (
            isinstance(engine, TorchEngine) and engine.same_kv_geometry(kv_source)
        ):
            raise ValueError("a draft engine takes another's keys and values only with the same KV geometry")
        self.engine = engine
        self.kv_source = kv_source
        # a head over some ids only (``draft_vocab``): a grammar may then leave a row nothing
        head_vocab = getattr(engine, "head_vocab", engine.vocab_size)
        self._partial_head = head_vocab < engine.vocab_size
        # sequences whose draft cache holds keys and values copied from the target (never shared)
        self._imported: set[int] = set()

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        return self.engine.room_for(lengths)

    def add_sequence(
        self, seq_id: int, max_length: int, cache_salt: str = "", token_ids: Sequence[int] = ()
    ) -> int:
        # a draft pool smaller than the target's caps how far a sequence can draft (``room_for``
        # then says no and the sequence decodes plain), never which sequences are served
        self.engine.add_sequence(seq_id, min(max_length, self.engine.max_context), cache_salt)
        if self.kv_source is not None or not token_ids:
            return 0  # a self-draft copies the target's keys and values when it first drafts
        # the pool's prefix cache now, not at the first draft: so the sequence holds those blocks
        # (they stay), and whether to start drafting weighs only what is left to feed
        return self.engine.reuse_prefix(seq_id, token_ids)

    def catch_up_from_caches(self, seq_id: int, token_ids: Sequence[int], own_kv: bool) -> None:
        """Before feeding what the draft cache lacks: a self-draft takes the target's keys and values
        (not for ``own_kv`` requests, whose output depends on their drafts); else the draft pool's
        prefix cache gives the blocks it holds of the sequence."""
        if self.kv_source is not None and not own_kv:
            assert isinstance(self.engine, TorchEngine)
            self.engine.import_kv(seq_id, self.kv_source, self.kv_source.cached_length(seq_id))
            self._imported.add(seq_id)
        elif seq_id not in self._imported:
            self.engine.reuse_prefix(seq_id, token_ids)

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        tokens: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = [i for i, r in enumerate(requests) if r.num_draft_tokens > 0]
        if self.kv_source is not None:
            active = self._import_target_kv(requests, active)
        else:
            for i in active:
                self.catch_up_from_caches(requests[i].seq_id, requests[i].token_ids, own_kv=True)
        # Position 0 feeds everything the draft cache lacks (the last verified token, or two when the
        # previous round accepted all drafts; the prompt and more when the sequence did not draft
        # before), later positions feed the previous draft token.
        feeds = {
            i: [*requests[i].token_ids[self.engine.cached_length(requests[i].seq_id) :], *requests[i].prefix]
            for i in active
        }
        # a prefix (forced tokens) is this round's drafts, not catching up
        catch_up = {i: max(len(f) - len(requests[i].prefix) - MAX_OWN_FEED, 0) for i, f in feeds.items()}
        while active:
            logits = self.engine.forward([ForwardInput(requests[i].seq_id, feeds[i], 1) for i in active])
            rows, drawing = [], []
            for i, row in zip(active, logits):
                request = requests[i]
                if request.sampling.shapes_logits:  # as the verifier will shape p (logits_rules.py)
                    context = [*request.token_ids, *request.prefix, *tokens[i]]
                    row = apply_rules(row, request.sampling, context)
                if request.guide is not None:  # and mask it by the grammar (guided/state.py)
                    row = request.guide.mask_logits(row, [*request.prefix, *tokens[i]])
                    if self._partial_head and not bool(row.amax() > float("-inf")):
                        continue  # the grammar admits only ids the draft head leaves out: no guess
                rows.append(row)
                drawing.append(i)
            drawn = (
                self._draw(
                    [requests[i] for i in drawing],
                    [len(tokens[i]) for i in drawing],
                    torch.cat(rows),
                    [probs[i] for i in drawing],
                )
                if drawing
                else []
            )
            for i, token in zip(drawing, drawn):
                tokens[i].append(token)
                feeds[i] = [token]
            active = [i for i in drawing if len(tokens[i]) < requests[i].num_draft_tokens]
        return [
            DraftProposal(
                tokens[i],
                torch.stack(probs[i]) if probs[i] else None,
                catch_up.get(i, 0),
            )
            for i, r in enumerate(requests)
        ]

    @staticmethod
    def _draw(
        requests: list[DraftRequest],
        drafted: list[int],
        logits: torch.Tensor,
        probs: list[list[torch.Tensor]],
    ) -> list[int]:
        """One draft token per request from its row of ``logits`` (``drafted[n]`` drafts already
        proposed): greedy and coupled rows in one batched call, rejection-rule rows sampled from their
        q, which is kept in ``probs[n]``."""
        by_rejection = [n for n, r in enumerate(requests) if r.sampling.samples_by_rejection]
        positions = [r.output_position + d for r, d in zip(requests, drafted)]
        drawn = coupled_tokens(logits, [r.sampling for r in requests], positions, skip=set(by_rejection))
        for n in by_rejection:
            q = logits_to_probs(logits[n : n + 1], requests[n].sampling)
            drawn[n] = int(sample(q, requests[n].generator)[0])
            probs[n].append(q[0])
        return drawn

    def _import_target_kv(self, requests: Sequence[DraftRequest], active: list[int]) -> list[int]:
        """Catch the draft caches up from the target's (not for requests whose output depends on their
        drafts); the requests that
        draft this round: not one whose prompt the target has not seen yet (it rides along with this
        step's verify pass), which next round takes from the target rather than through the draft
        model now. Proposing nothing is always allowed: that round decodes plain."""
        assert isinstance(self.engine, TorchEngine) and self.kv_source is not None
        drafting = []
        for i in active:
            r = requests[i]
            own_kv = r.sampling.output_depends_on_drafts
            self.catch_up_from_caches(r.seq_id, r.token_ids, own_kv)
            if own_kv or len(r.token_ids) - self.engine.cached_length(r.seq_id) <= MAX_OWN_FEED:
                drafting.append(i)
        return drafting

    def rollback(self, seq_id: int, num_verified: int) -> None:
        if self.engine.cached_length(seq_id) > num_verified:
            self.engine.truncate(seq_id, num_verified)

    def cached_length(self, seq_id: int) -> int:
        return self.engine.cached_length(seq_id)

    def cache_verified(self, seq_id: int, token_ids: Sequence[int]) -> None:
        if seq_id not in self._imported:
            self.engine.cache_verified(seq_id, token_ids)

    def free(self, seq_id: int) -> None:
        self._imported.discard(seq_id)
        self.engine.free(seq_id)

    def kv_usage(self) -> KVUsage | None:
        return self.engine.kv_usage()

    def reset_prefix_cache(self) -> PrefixCacheReset | None:
        return self.engine.reset_prefix_cache()
